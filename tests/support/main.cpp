// The one main() of every test executable: a GoogleTest binary that is also, when started as a
// worker of a multi-process test, one rank of that job (support/multiprocess.hpp).
#include "multiprocess.hpp"

int main(int argc, char** argv) { return accelerate::testing::multiprocess_main(argc, argv); }
