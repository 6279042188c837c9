// main() of the reliability tests (they start workers from this binary).
#include "../support/multiprocess.hpp"

int main(int argc, char** argv) { return accelerate::testing::multiprocess_main(argc, argv); }
