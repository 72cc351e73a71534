/* tests/posix_minimal.h - forced into every file of tests/run.sh's section 2g (gcc -include, with -D_GNU_SOURCE
   and -DDT_POSIX_MINIMAL, without OpenMP): the POSIX and Linux calls macOS lacks are poisoned, so a use of one in
   the library or a test stops the build on Linux, naming it, instead of on a Mac nobody here has.
   _GNU_SOURCE makes glibc's headers declare them all (strict C11 alone hides most, which would also stop a use,
   but not in a program compiled as gnu11 or C++); the headers that declare them are included first, as their
   declarations would otherwise trip the poison. What macOS has instead: dtrain/core/base.h (DT_POSIX_MINIMAL). */
#ifndef DT_TEST_POSIX_MINIMAL_H
#define DT_TEST_POSIX_MINIMAL_H
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>
/* barriers and spin locks */
#pragma GCC poison pthread_barrier_t pthread_barrierattr_t pthread_barrier_init pthread_barrier_wait pthread_barrier_destroy
#pragma GCC poison pthread_spinlock_t pthread_spin_init pthread_spin_lock pthread_spin_trylock pthread_spin_unlock pthread_spin_destroy
/* timers, timed and unnamed semaphores (macOS's sem_init fails with ENOSYS), clock_nanosleep */
#pragma GCC poison timer_create timer_settime timer_gettime timer_delete sem_timedwait sem_init sem_destroy clock_nanosleep
/* timed locks and joins, a condition's clock, CPU-time clocks, affinity */
#pragma GCC poison pthread_mutex_timedlock pthread_rwlock_timedrdlock pthread_rwlock_timedwrlock pthread_condattr_setclock
#pragma GCC poison pthread_timedjoin_np pthread_tryjoin_np pthread_getcpuclockid clock_getcpuclockid
#pragma GCC poison pthread_setaffinity_np sched_setaffinity sched_getcpu
/* signals waited for with a timeout, glibc's own (macOS's qsort_r takes its arguments in another order) */
#pragma GCC poison sigtimedwait sigwaitinfo get_nprocs memalign qsort_r fdatasync
#endif
