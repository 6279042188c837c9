// How the library's type-independent functions are compiled: inline in every translation unit
// (header-only, the default) or once per program (ACCELERATE_SEPARATE_COMPILATION).
//
// A header declares such a function and its sibling .ipp defines it with ACCELERATE_INLINE.
// Header-only, the header includes its .ipp and ACCELERATE_INLINE is `inline`. Defining
// ACCELERATE_SEPARATE_COMPILATION in every translation unit of a program (CMake:
// link accelerate::separate_compilation) leaves the bodies out of the headers, and exactly
// one source file of the program includes <accelerate/implementation.hpp>, where they are
// compiled, non-inline, once. A trainer's translation unit then neither parses nor generates
// code for them (bench/README.md, "Compile cost of a trainer", measures what that saves).
// Function templates and the policy-dependent code stay in the headers in both modes.
#pragma once

#if defined(ACCELERATE_SEPARATE_COMPILATION)
#define ACCELERATE_INLINE
#else
#define ACCELERATE_INLINE inline
#endif
