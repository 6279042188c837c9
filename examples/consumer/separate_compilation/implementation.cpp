// The one source file of the program that compiles the library's bodies.
#include <accelerate/implementation.hpp>
