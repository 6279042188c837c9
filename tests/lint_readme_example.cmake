# Fails when README.md does not contain examples/minimal.cpp verbatim (cmake -P, -DROOT=<repo>).
file(READ "${ROOT}/README.md" readme)
file(READ "${ROOT}/examples/minimal.cpp" example)
string(FIND "${readme}" "${example}" position)
if(position EQUAL -1)
  message(FATAL_ERROR "README.md does not show examples/minimal.cpp verbatim; update one or the other")
endif()
message(STATUS "README.md shows examples/minimal.cpp verbatim")
