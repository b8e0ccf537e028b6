# Decides whether the CUDA kernels are built, and enables the CUDA language if so.
#
# CUDA is used only when SPARSYNC_CUDA is ON (the default) and nvcc is found: through
# CMAKE_CUDA_COMPILER or CUDACXX, on PATH, or at /usr/local/cuda/bin/nvcc. Without nvcc nothing
# changes: CPU-only builds never see kernels/cuda/. Sets SPARSYNC_KERNELS_CUDA (ON/OFF) in the
# including scope.
#
# Included by kernels/CMakeLists.txt. enable_language() must run in the highest directory that
# holds a target using CUDA, directly or through linking: every CUDA target lives under kernels/,
# and sparsync_kernels_cuda links the static CUDA runtime by its file path, so targets elsewhere
# can link it without enabling CUDA themselves. Including this file again from a parent directory
# is harmless.
include_guard(DIRECTORY)

option(SPARSYNC_CUDA "Build the CUDA kernels when nvcc is found" ON)
set(SPARSYNC_CUDA_ARCHITECTURES "80-real;90-real;90-virtual" CACHE STRING
    "CUDA architectures of the kernels (sm_80 and sm_90 code plus compute_90 PTX by default)")
set(SPARSYNC_KERNELS_CUDA OFF)

if(SPARSYNC_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(SPARSYNC_NVCC nvcc)
    if(NOT SPARSYNC_NVCC AND EXISTS /usr/local/cuda/bin/nvcc)
      set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${SPARSYNC_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    # CMake < 3.26 has no flag for the CUDA20 dialect of nvcc, which targets need as soon as they
    # link sparsync_kernels (cxx_std_20 applies to their CUDA sources too). nvcc >= 12 has it.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND
       CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit)
    find_package(Threads REQUIRED)
    if(CUDAToolkit_FOUND AND CUDA_cudart_static_LIBRARY)
      set(SPARSYNC_KERNELS_CUDA ON)
      message(STATUS "sparsync: CUDA kernels enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                     "architectures ${SPARSYNC_CUDA_ARCHITECTURES})")
    else()
      message(STATUS "sparsync: nvcc found but not the CUDA toolkit libraries; CUDA kernels off")
    endif()
  else()
    message(STATUS "sparsync: nvcc not found; CUDA kernels off")
  endif()
endif()
