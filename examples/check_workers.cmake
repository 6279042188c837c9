# --workers changes how batches are read, never what is read (cmake -P): the JSON of runs with
# and without dataloader workers is the same, on one process and on two. "seconds" and the
# time on collectives describe the process, not the training, and are left out. The first
# 12800 training samples (200 batches of 64) keep the four runs short.
#   -DEXE=<fashion_mnist>
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/example_json.cmake)

function(run out_json)
  example_json(last ARGS --no-progress --epochs 1 --max-train-samples 12800 ${ARGN})
  foreach(key seconds comm_seconds comm_exposed_seconds comm_overlap)
    string(JSON last REMOVE "${last}" ${key})
  endforeach()
  set(${out_json} "${last}" PARENT_SCOPE)
endfunction()

foreach(nproc 1 2)
  run(without --nproc ${nproc})
  run(with --nproc ${nproc} --workers 3)
  if(NOT without STREQUAL with)
    message(FATAL_ERROR "--workers 3 on ${nproc} process(es) changed the run:\n${without}\n${with}")
  endif()
endforeach()
message(STATUS "the runs with workers equal those without")
