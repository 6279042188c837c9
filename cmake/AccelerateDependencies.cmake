# Finds what accelerate::accelerate links: LibTorch 2.x (cmake/AccelerateTorch.cmake),
# Boost (Hana), range-v3, nlohmann-json, zlib, Gloo's headers and, optionally, yaml-cpp.

include_guard(GLOBAL)

include(AccelerateTorch)
accelerate_find_torch()

find_package(Boost 1.74 REQUIRED)
find_package(range-v3 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(ZLIB REQUIRED)
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
  HINTS ${TORCH_INCLUDE_DIRS} "${PROJECT_SOURCE_DIR}/third_party/gloo/include"
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
