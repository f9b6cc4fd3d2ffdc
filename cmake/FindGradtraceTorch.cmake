# Imports LibTorch from the `torch` wheel in the project's .venv without running
# the wheel's own TorchConfig.cmake.
#
# Why not find_package(Torch): the PyPI wheel is a CUDA build (torch 2.15.0+cu132)
# whose TorchConfig pulls in Caffe2's cuda.cmake. That demands a CUDA toolkit at
# configure time and links the system toolkit's libnvrtc (13.0 here) next to the
# wheel's own 13.2 runtime. The capture code needs only the CPU libraries
# (libtorch_cpu, libc10: autograd, ATen, c10d Gloo), so we import those, and the
# CUDA ones (libtorch_cuda, libc10_cuda: NCCL) only when GRADTRACE_CUDA=ON.
#
# c10d's ProcessGroupGloo.hpp includes gloo headers, which the wheel does not
# ship. Debian's libgloo-dev supplies them for compilation only: every gloo type
# in that header is held by pointer, so the class layout (and the allocation
# size of make_intrusive<ProcessGroupGloo>) does not depend on the gloo version.
#
# Input:  GRADTRACE_TORCH_DIR (the torch package directory; default: ask .venv's python)
# Output: target gradtrace::torch (and gradtrace::torch_cuda with GRADTRACE_CUDA)

if(NOT GRADTRACE_TORCH_DIR AND EXISTS "${CMAKE_SOURCE_DIR}/.venv/bin/python")
  execute_process(COMMAND "${CMAKE_SOURCE_DIR}/.venv/bin/python" -c "import os, torch; print(os.path.dirname(torch.__file__))"
                  OUTPUT_VARIABLE _dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0)
    set(GRADTRACE_TORCH_DIR "${_dir}" CACHE PATH "torch package directory")
  endif()
endif()

find_library(GRADTRACE_TORCH_CPU_LIB torch_cpu PATHS "${GRADTRACE_TORCH_DIR}/lib" NO_DEFAULT_PATH)
find_library(GRADTRACE_C10_LIB c10 PATHS "${GRADTRACE_TORCH_DIR}/lib" NO_DEFAULT_PATH)
find_path(GRADTRACE_GLOO_INCLUDE gloo/algorithm.h)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(GradtraceTorch
  REQUIRED_VARS GRADTRACE_TORCH_DIR GRADTRACE_TORCH_CPU_LIB GRADTRACE_C10_LIB GRADTRACE_GLOO_INCLUDE)

if(GradtraceTorch_FOUND AND NOT TARGET gradtrace::torch)
  add_library(gradtrace::torch INTERFACE IMPORTED)
  # The wheel is built with the C++11 ABI and requires C++20 (torch/all.h checks).
  target_compile_features(gradtrace::torch INTERFACE cxx_std_20)
  target_compile_definitions(gradtrace::torch INTERFACE USE_C10D_GLOO _GLIBCXX_USE_CXX11_ABI=1)
  # SYSTEM: LibTorch's own headers are not ours to keep -Wextra clean.
  target_include_directories(gradtrace::torch SYSTEM INTERFACE
    "${GRADTRACE_TORCH_DIR}/include" "${GRADTRACE_TORCH_DIR}/include/torch/csrc/api/include"
    "${GRADTRACE_GLOO_INCLUDE}")
  target_link_libraries(gradtrace::torch INTERFACE "${GRADTRACE_TORCH_CPU_LIB}" "${GRADTRACE_C10_LIB}")
  # The wheel's libraries find their CUDA runtime through their own RPATH.
  target_link_options(gradtrace::torch INTERFACE "-Wl,-rpath,${GRADTRACE_TORCH_DIR}/lib")

  if(GRADTRACE_CUDA)
    find_package(CUDAToolkit REQUIRED)
    find_library(GRADTRACE_TORCH_CUDA_LIB torch_cuda PATHS "${GRADTRACE_TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
    find_library(GRADTRACE_C10_CUDA_LIB c10_cuda PATHS "${GRADTRACE_TORCH_DIR}/lib" NO_DEFAULT_PATH REQUIRED)
    add_library(gradtrace::torch_cuda INTERFACE IMPORTED)
    target_compile_definitions(gradtrace::torch_cuda INTERFACE USE_CUDA USE_C10D_NCCL)
    target_link_libraries(gradtrace::torch_cuda INTERFACE gradtrace::torch CUDA::cudart
                          "${GRADTRACE_TORCH_CUDA_LIB}" "${GRADTRACE_C10_CUDA_LIB}")
    # Force libtorch_cuda.so to load so its CUDA kernels register with the dispatcher.
    target_link_options(gradtrace::torch_cuda INTERFACE "-Wl,--no-as-needed")
    # libtorch_cuda.so needs the wheel's own CUDA libraries (nvidia-* wheels, e.g.
    # NCCL 2.30), found at run time through its $ORIGIN RPATH, which ld does not
    # expand at link time: without -rpath-link it resolves libnccl.so.2 to the
    # system toolkit's older NCCL and fails on missing symbols.
    file(GLOB _nvidia_lib_dirs LIST_DIRECTORIES true "${GRADTRACE_TORCH_DIR}/../nvidia/*/lib")
    foreach(_dir IN LISTS _nvidia_lib_dirs)
      target_link_options(gradtrace::torch_cuda INTERFACE "-Wl,-rpath-link,${_dir}")
    endforeach()
  endif()
endif()
