// main() of the checkpoint tests (multi-process for resume exactness on 2 ranks).
#include "../support/multiprocess.hpp"

int main(int argc, char** argv) { return accelerate::testing::multiprocess_main(argc, argv); }
