// Bodies of check.hpp's type-independent functions (see detail/linkage.hpp).
#pragma once

#include <sstream>

#include <accelerate/detail/check.hpp>

namespace accelerate::detail {

ACCELERATE_INLINE void throw_message(std::initializer_list<MessagePart> parts) {
  std::ostringstream out;
  for (const auto& part : parts) part.write(out, part.value);
  throw Error(out.str());
}

}  // namespace accelerate::detail
