// Being written (issue 27).
#include <pybind11/pybind11.h>
