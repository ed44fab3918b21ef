/* vImageScale_ARGB8888 for the portable build: a separable bilinear (triangle-filter) resize
 * with edge extension. Apple's "high quality" resampling is a Lanczos filter; the pictures
 * the portable backend produces are not meant to be looked at, so a simpler filter of the
 * same shape contract serves: every output pixel written, channels kept, no overflow. */
#include "compat/Accelerate/Accelerate.h"

#include <math.h>
#include <stdlib.h>

static double source_coordinate(vImagePixelCount out, vImagePixelCount in, vImagePixelCount index) {
    double scale = (double)in / (double)out;
    double x = ((double)index + 0.5) * scale - 0.5;
    if (x < 0.0) x = 0.0;
    if (x > (double)(in - 1)) x = (double)(in - 1);
    return x;
}

vImage_Error vImageScale_ARGB8888(const vImage_Buffer *src, const vImage_Buffer *dest,
                                  void *tempBuffer, vImage_Flags flags) {
    (void)tempBuffer;
    (void)flags;
    if (!src || !dest || !src->data || !dest->data) return kvImageInvalidParameter;
    if (!src->width || !src->height || !dest->width || !dest->height) return kvImageInvalidParameter;
    for (vImagePixelCount y = 0; y < dest->height; y++) {
        double sy = source_coordinate(dest->height, src->height, y);
        vImagePixelCount y0 = (vImagePixelCount)sy;
        vImagePixelCount y1 = y0 + 1 < src->height ? y0 + 1 : y0;
        double fy = sy - (double)y0;
        unsigned char *out_row = (unsigned char *)dest->data + y * dest->rowBytes;
        const unsigned char *row0 = (const unsigned char *)src->data + y0 * src->rowBytes;
        const unsigned char *row1 = (const unsigned char *)src->data + y1 * src->rowBytes;
        for (vImagePixelCount x = 0; x < dest->width; x++) {
            double sx = source_coordinate(dest->width, src->width, x);
            vImagePixelCount x0 = (vImagePixelCount)sx;
            vImagePixelCount x1 = x0 + 1 < src->width ? x0 + 1 : x0;
            double fx = sx - (double)x0;
            for (int c = 0; c < 4; c++) {
                double top = row0[4 * x0 + c] * (1.0 - fx) + row0[4 * x1 + c] * fx;
                double bottom = row1[4 * x0 + c] * (1.0 - fx) + row1[4 * x1 + c] * fx;
                double value = top * (1.0 - fy) + bottom * fy;
                long rounded = lround(value);
                out_row[4 * x + c] = (unsigned char)(rounded < 0 ? 0 : rounded > 255 ? 255 : rounded);
            }
        }
    }
    return kvImageNoError;
}
