/*
 * GAAC_API marks the declarations the shared library exports; everything else in it is hidden.
 * Usable from C and C++.
 */
#ifndef GAAC_EXPORT_H
#define GAAC_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define GAAC_API __attribute__((visibility("default")))
#else
#define GAAC_API
#endif

#endif /* GAAC_EXPORT_H */
