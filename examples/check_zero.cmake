# --zero N trains what data parallel trains (cmake -P): `fashion_mnist --nproc 2` on the first
# 6400 samples (50 steps of 2 x 64) with Gloo and with each ZeRO stage, with clipping. Sharded
# training is data parallel's arithmetic cut into slices (the library's tests hold the
# parameters to 1e-6), so test accuracy agrees within 0.2 points and the mean training loss to
# 1e-4 relative; each run reports its backend. With -DNPROC=1 the runs are one process each,
# and every stage must train as SingleProcess does (clipping included).
#   -DEXE=<fashion_mnist> -DPYTHON=<python3, for the arithmetic cmake lacks> [-DNPROC=1]
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/example_json.cmake)
if(NOT DEFINED NPROC)
  set(NPROC 2)
endif()

function(run expected_backend out_json)
  example_json(last ARGS --nproc ${NPROC} --epochs 1 --max-train-samples 6400 --clip-norm 1.0 --no-progress ${ARGN})
  string(JSON backend GET "${last}" backend)
  if(NOT backend STREQUAL expected_backend)
    message(FATAL_ERROR "asked for ${expected_backend}, the run reports ${backend}")
  endif()
  set(${out_json} "${last}" PARENT_SCOPE)
endfunction()

if(NPROC EQUAL 1)
  run(SingleProcess ddp)
else()
  run(Gloo ddp)
endif()
string(JSON ddp_accuracy GET "${ddp}" test_accuracy)
string(JSON ddp_loss GET "${ddp}" train_loss)
foreach(stage 1 2 3)
  run("Zero<Gloo,${stage}>" zero --zero ${stage})
  string(JSON accuracy GET "${zero}" test_accuracy)
  string(JSON loss GET "${zero}" train_loss)
  execute_process(COMMAND ${PYTHON} -c
                  "import sys; a,b,c,d=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=0.002 and abs(c-d)<=1e-4*abs(d) else 1)"
                  ${accuracy} ${ddp_accuracy} ${loss} ${ddp_loss} RESULT_VARIABLE differs)
  if(NOT differs EQUAL 0)
    message(FATAL_ERROR "--zero ${stage}: accuracy ${accuracy}, loss ${loss}; data parallel: ${ddp_accuracy}, ${ddp_loss}")
  endif()
endforeach()

message(STATUS "every ZeRO stage trains as data parallel does")
