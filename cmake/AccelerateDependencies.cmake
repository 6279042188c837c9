# Finds what accelerate::accelerate links: LibTorch 2.x (cmake/AccelerateTorch.cmake),
# Boost (Hana), nlohmann-json, zlib, Gloo's headers and, optionally, yaml-cpp. (range-v3 is
# found by tests/ only: a test iterates prepared loaders through its views; no header needs it.)

include_guard(GLOBAL)

include(AccelerateTorch)
accelerate_find_torch()

# On a machine without our Debian packages (a GPU host), scripts/prepare-gpu-carry.sh brings
# the header-only ones in third_party/; they stand in for what find_package does not find.
set(ACCELERATE_THIRD_PARTY_DIR "" CACHE PATH
    "third_party/ made by scripts/prepare-gpu-carry.sh, used for what is not installed")
function(_accelerate_header_only target found_var)
  if(NOT ${found_var})
    if(NOT ACCELERATE_THIRD_PARTY_DIR OR NOT EXISTS "${ACCELERATE_THIRD_PARTY_DIR}/include")
      message(FATAL_ERROR "accelerate: ${target} not found; install it (scripts/quickstart.sh) "
                          "or pass -DACCELERATE_THIRD_PARTY_DIR=<third_party>")
    endif()
    add_library(${target} INTERFACE IMPORTED GLOBAL)
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${ACCELERATE_THIRD_PARTY_DIR}/include")
    message(STATUS "accelerate: ${target} from ${ACCELERATE_THIRD_PARTY_DIR}/include")
  endif()
endfunction()
find_package(Boost 1.74 QUIET)
_accelerate_header_only(Boost::headers Boost_FOUND)
find_package(nlohmann_json 3.10 QUIET)
_accelerate_header_only(nlohmann_json::nlohmann_json nlohmann_json_FOUND)
# zlib reads the gzip'd IDX files; without it the reader pipes them through `gzip -dc`.
find_package(ZLIB QUIET)
# Optional: only <accelerate/config.hpp> (YAML run configurations) needs it.
find_package(yaml-cpp QUIET)
if(TARGET yaml-cpp)
  set(ACCELERATE_WITH_YAML ON)
else()
  set(ACCELERATE_WITH_YAML OFF)
endif()

# ProcessGroupGloo.hpp includes <gloo/...>; PyTorch's wheel does not ship those headers.
# Debian's libgloo-dev provides them (only pointers to gloo types appear in c10d's classes, so
# the declarations are all that is needed; the code is inside libtorch_cpu).
find_path(ACCELERATE_GLOO_INCLUDE_DIR gloo/algorithm.h
  HINTS ${TORCH_INCLUDE_DIRS} "${ACCELERATE_THIRD_PARTY_DIR}/include"
  DOC "Folder holding gloo/algorithm.h")
if(NOT ACCELERATE_GLOO_INCLUDE_DIR)
  message(WARNING "accelerate: Gloo headers not found (apt-get install libgloo-dev); the Gloo "
                  "backend will not compile. Set ACCELERATE_GLOO_INCLUDE_DIR to their folder.")
endif()

# CUDA/NCCL paths compile wherever the LibTorch build has CUDA, even without a GPU.
if(TARGET torch_cuda OR ACCELERATE_TORCH_IMPORTED_CUDA)
  set(ACCELERATE_TORCH_HAS_CUDA ON)
else()
  set(ACCELERATE_TORCH_HAS_CUDA OFF)
endif()

# Included through add_subdirectory/FetchContent, the imported targets found above must be
# visible to the parent project, which links accelerate::accelerate and so, indirectly, them.
if(NOT PROJECT_IS_TOP_LEVEL)
  get_directory_property(_accelerate_imported IMPORTED_TARGETS)
  foreach(_target IN LISTS _accelerate_imported)
    get_target_property(_global ${_target} IMPORTED_GLOBAL)
    if(NOT _global)
      set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()
