/* The one part of Apple's Accelerate framework upstream's C code uses (h3_host.c's image
 * resize): vImageScale_ARGB8888, implemented by h3bridge's portable backend
 * (h3_portable_vimage.c). Declarations follow Apple's documented vImage API. */
#ifndef H3_PORTABLE_ACCELERATE_H
#define H3_PORTABLE_ACCELERATE_H

#include <stddef.h>
#include <stdint.h>

typedef unsigned long vImagePixelCount;
typedef struct {
    void *data;
    vImagePixelCount height;
    vImagePixelCount width;
    size_t rowBytes;
} vImage_Buffer;
typedef long vImage_Error;
typedef uint32_t vImage_Flags;

enum {
    kvImageNoError = 0,
    kvImageInvalidParameter = -21773,
    kvImageMemoryAllocationError = -21771
};
enum {
    kvImageNoFlags = 0,
    kvImageEdgeExtend = 8,
    kvImageHighQualityResampling = 32
};

vImage_Error vImageScale_ARGB8888(const vImage_Buffer *src, const vImage_Buffer *dest,
                                  void *tempBuffer, vImage_Flags flags);

#endif
