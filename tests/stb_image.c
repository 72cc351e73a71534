/* stb_image's, stb_image_resize's and stb_image_write's implementations (what Debian's -lstb holds of them),
   compiled once into $(B)/obj/stb_image.o when the Makefile builds with STB_DIR=DIR, a folder of upstream's
   stb_image.h, stb_image_resize.h and stb_image_write.h (made <stb/...> by the link $(B)/stb/stb), and linked
   into every program: the library decodes and resizes with the first two, tests/test_datasets.c writes its
   images with the third. */
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
