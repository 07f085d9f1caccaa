// Does not compile, on purpose: the loader must fall back past it.
#include <torch/csrc/stable/library.h>
int broken() { return this_symbol_does_not_exist; }
