// Must not compile: a number handed to a tensor collective would come back as this rank's own
// value. Twin of collective_leaf_ok.cpp.
#include <accelerate/accelerate.hpp>

double total_loss(accelerate::Accelerator<accelerate::Gloo>& acc, double loss) { return acc.reduce(loss); }
