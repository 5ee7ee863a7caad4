# Detects the optional components and records them for the summary. Nothing
# here is required except cJSON: a missing component turns off what needs it
# and the tests that need it skip (exit 77) naming what is missing.

find_package(cJSON CONFIG REQUIRED)
find_package(PkgConfig QUIET)

set(WNA16_COMPONENT_DEFINES "")
set(WNA16_SUMMARY "")

macro(wna16_component name found detail)
  if(${found})
    list(APPEND WNA16_SUMMARY "  ${name}: yes (${detail})")
  else()
    list(APPEND WNA16_SUMMARY "  ${name}: NO  (${detail})")
  endif()
endmacro()

# cJSON (required)
wna16_component("cJSON" TRUE "${cJSON_VERSION}")

# LLVM 19 (CPU JIT). LLVMConfigVersion needs major.minor, so ask for 19.1.
# -DWNA16_WITH_LLVM=OFF builds without it (how GPU machines without LLVM
# build, and how the suite checks that such builds still pass).
option(WNA16_WITH_LLVM "Use LLVM 19 for the CPU target when found" ON)
if(WNA16_WITH_LLVM)
  find_package(LLVM 19.1 CONFIG QUIET
    PATHS /usr/lib/llvm-19/lib/cmake/llvm NO_DEFAULT_PATH)
endif()
if(LLVM_FOUND)
  set(WNA16_HAVE_LLVM ON)
  list(APPEND WNA16_COMPONENT_DEFINES WNA16_HAVE_LLVM=1)
  wna16_component("LLVM 19" TRUE "${LLVM_PACKAGE_VERSION}, ${LLVM_DIR}")
else()
  set(WNA16_HAVE_LLVM OFF)
  wna16_component("LLVM 19" FALSE "install llvm-19-dev")
endif()

# CUDA headers + NVRTC (loaded with dlopen at run time; headers for the API).
option(WNA16_WITH_CUDA "Build the CUDA target when its headers are found" ON)
set(WNA16_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit root")
if(WNA16_WITH_CUDA)
  find_path(WNA16_NVRTC_INCLUDE nvrtc.h HINTS ${WNA16_CUDA_ROOT}/include)
  find_path(WNA16_CUDA_INCLUDE cuda.h HINTS ${WNA16_CUDA_ROOT}/include)
endif()
if(WNA16_WITH_CUDA AND WNA16_NVRTC_INCLUDE AND WNA16_CUDA_INCLUDE)
  set(WNA16_HAVE_CUDA ON)
  list(APPEND WNA16_COMPONENT_DEFINES WNA16_HAVE_CUDA=1)
  wna16_component("NVRTC/CUDA headers" TRUE "${WNA16_NVRTC_INCLUDE}")
else()
  set(WNA16_HAVE_CUDA OFF)
  if(WNA16_WITH_CUDA)
    wna16_component("NVRTC/CUDA headers" FALSE "no nvrtc.h/cuda.h under ${WNA16_CUDA_ROOT}")
  else()
    wna16_component("NVRTC/CUDA headers" FALSE "WNA16_WITH_CUDA=OFF")
  endif()
endif()

# Level Zero loader
set(WNA16_HAVE_LEVEL_ZERO OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_ZE QUIET level-zero)
  if(PC_ZE_FOUND)
    set(WNA16_HAVE_LEVEL_ZERO ON)
    list(APPEND WNA16_COMPONENT_DEFINES WNA16_HAVE_LEVEL_ZERO=1)
  endif()
endif()
wna16_component("Level Zero loader" WNA16_HAVE_LEVEL_ZERO
  "${PC_ZE_VERSION}; install libze-dev")

# SPIRV-Tools (static only on Debian 12: the C++ library is linked with
# stdc++) and the SPIR-V headers (spirv.h, OpenCL.std.h: the numbers the
# SPIR-V emitter writes). Both or neither: gen/emit_spirv.c validates every
# module it emits, so without the validator it emits none.
find_package(SPIRV-Tools CONFIG QUIET)
find_path(WNA16_SPIRV_HEADERS spirv/unified1/spirv.h)
if(TARGET SPIRV-Tools-static AND WNA16_SPIRV_HEADERS)
  set(WNA16_HAVE_SPIRV_TOOLS ON)
  list(APPEND WNA16_COMPONENT_DEFINES WNA16_HAVE_SPIRV_TOOLS=1)
  wna16_component("SPIRV-Tools" TRUE "static library, headers in ${WNA16_SPIRV_HEADERS}")
else()
  set(WNA16_HAVE_SPIRV_TOOLS OFF)
  wna16_component("SPIRV-Tools" FALSE "install spirv-tools and spirv-headers")
endif()

# OpenCL headers (the ocl target: SPIR-V reverse-translated by llvm-spirv-15
# and built by an OpenCL driver, PoCL on these machines). Only the headers:
# libOpenCL.so.1 and the translator are found at run time, and the target
# needs the SPIR-V emitter.
find_path(WNA16_OPENCL_HEADERS CL/cl.h)
if(WNA16_OPENCL_HEADERS AND WNA16_HAVE_SPIRV_TOOLS)
  set(WNA16_HAVE_OPENCL ON)
  list(APPEND WNA16_COMPONENT_DEFINES WNA16_HAVE_OPENCL=1)
  wna16_component("OpenCL headers" TRUE "${WNA16_OPENCL_HEADERS}, the ocl target")
else()
  set(WNA16_HAVE_OPENCL OFF)
  wna16_component("OpenCL headers" FALSE "install ocl-icd-opencl-dev (and SPIRV-Tools)")
endif()

# xxHash (cache keys)
set(WNA16_HAVE_XXHASH OFF)
find_path(WNA16_XXHASH_INCLUDE xxhash.h)
find_library(WNA16_XXHASH_LIB xxhash)
if(WNA16_XXHASH_INCLUDE AND WNA16_XXHASH_LIB)
  set(WNA16_HAVE_XXHASH ON)
  list(APPEND WNA16_COMPONENT_DEFINES WNA16_HAVE_XXHASH=1)
endif()
wna16_component("xxHash" WNA16_HAVE_XXHASH "install libxxhash-dev")

# Sanitizers for the robustness tests
include(CheckCSourceCompiles)
set(WNA16_SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer)
if(CMAKE_C_COMPILER_ID STREQUAL "Clang")
  # clang's UBSan `function` check crashes on calls into JIT code.
  list(APPEND WNA16_SAN_FLAGS -fno-sanitize=function)
endif()
set(CMAKE_REQUIRED_FLAGS "${WNA16_SAN_FLAGS}")
string(REPLACE ";" " " CMAKE_REQUIRED_FLAGS "${CMAKE_REQUIRED_FLAGS}")
set(CMAKE_REQUIRED_LINK_OPTIONS ${WNA16_SAN_FLAGS})
check_c_source_compiles("int main(void){return 0;}" WNA16_HAVE_SANITIZERS)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
wna16_component("ASan+UBSan" WNA16_HAVE_SANITIZERS "${CMAKE_C_COMPILER_ID}")

function(wna16_print_summary)
  message(STATUS "")
  message(STATUS "wna16 ${PROJECT_VERSION} components:")
  foreach(line IN LISTS WNA16_SUMMARY)
    message(STATUS "${line}")
  endforeach()
  message(STATUS "  warnings as errors: ${WNA16_WERROR}")
  message(STATUS "")
endfunction()
