// main() of the distributed tests: a GoogleTest binary that is also its own worker processes.
#include "../support/multiprocess.hpp"

int main(int argc, char** argv) { return accelerate::testing::multiprocess_main(argc, argv); }
