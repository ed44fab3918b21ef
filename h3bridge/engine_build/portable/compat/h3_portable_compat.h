/* Force-included (-include) before every upstream h3.c file when building on Linux.
 * Only spellings differ; nothing here changes what upstream's code does. */
#ifndef H3_PORTABLE_COMPAT_H
#define H3_PORTABLE_COMPAT_H

/* h3_ffmpeg.c uses SSIZE_MAX, which Darwin's headers reach without <limits.h>. */
#include <limits.h>

/* h3.c reads struct stat's modification time under Darwin's name; Linux calls it st_mtim. */
#define st_mtimespec st_mtim

#endif
