# The CUDA benchmark programs (bench/gemm, bench/attention): built wherever
# nvcc is (CI too, so that they keep compiling); they run only on a Hopper GPU.
# The kernels need the architecture-specific sm_90a target, so each program
# sets its own -gencode whatever the build's CUDA architectures.
include(CheckLanguage)
if(NOT CMAKE_CUDA_COMPILER)
  check_language(CUDA)
endif()
if(CMAKE_CUDA_COMPILER)
  enable_language(CUDA)
  find_package(CUDAToolkit)
endif()

# trainerd_hopper_bench(NAME SOURCES... LIBS...): NAME from its sources,
# linked with trainerd_base, the CUDA runtime and LIBS; not built (said so)
# where nvcc or a library target of LIBS is missing.
function(trainerd_hopper_bench name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LIBS")
  foreach(required CUDA::cudart ${arg_LIBS})
    if(required MATCHES "::" AND NOT TARGET ${required})
      message(STATUS "${name}: not built (no nvcc or no ${required})")
      return()
    endif()
  endforeach()
  add_executable(${name} ${arg_SOURCES})
  set_target_properties(${name} PROPERTIES
    CUDA_ARCHITECTURES OFF
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON)
  target_link_libraries(${name} PRIVATE trainerd_base CUDA::cudart ${arg_LIBS})
  target_compile_options(${name} PRIVATE -gencode=arch=compute_90a,code=sm_90a
                         -Xcompiler=-O3,-Wall,-Wextra -Xptxas=-O3 -lineinfo)
endfunction()
