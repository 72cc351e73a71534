/* tools/stb_impl.c - the implementations of stb_image and stb_image_resize (dtrain.h's image folders), and of
   stb_image_write (tests/test_datasets.c writes its images with it), compiled once where there is no -lstb (Debian's
   libstb-dev holds them): make STB_DIR=DIR, DIR holding stb/stb_image.h, stb/stb_image_resize.h and
   stb/stb_image_write.h (README.md's "macOS"). dtrain.h includes the declarations alone (DT_USE_STB_IMAGE). */
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
