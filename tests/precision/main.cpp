// main() of the precision tests (multi-process for the cross-rank overflow decision).
#include "../support/multiprocess.hpp"

int main(int argc, char** argv) { return accelerate::testing::multiprocess_main(argc, argv); }
