# The command-line tools (gradtrace-diff, -inspect, -pack) linked against static protobuf, zstd, RE2 and zlib
# where those archives exist (Debian's -dev packages ship them): measured on the 2-core VM,
# `gradtrace-diff --help` took 2.1 CPU-ms (2.5 ms wall) with them shared against 1.4 (1.8) static, the difference
# mostly the dynamic loader's symbol lookups (docs/dev/performance.md). libstdc++ and libgcc stay shared (0.5 ms
# more): they are on the manylinux allow-list, and static ones call arc4random (glibc 2.36) and _dl_find_object
# (2.35), which would raise the wheel's glibc floor from 2.34. The libraries the tools share with the Python
# module and the tests stay as they are (Debian's libprotobuf.a cannot go into a shared object): a target opts
# in with gradtrace_link_static_tool(), and the codec's third-party libraries follow the property
# GRADTRACE_STATIC_DEPS of the target being linked (gt_third_party).
#
# -DGRADTRACE_STATIC_TOOLS=OFF links them dynamically (also the default under sanitizers and the fuzz build).
set(_static_default ON)
if(GRADTRACE_FUZZ OR GRADTRACE_SANITIZE)
  set(_static_default OFF)
endif()
option(GRADTRACE_STATIC_TOOLS "Link the command-line tools against static protobuf, zstd, RE2 and zlib"
       ${_static_default})

add_library(gt_third_party_shared INTERFACE)
target_link_libraries(gt_third_party_shared INTERFACE protobuf::libprotobuf PkgConfig::ZSTD PkgConfig::RE2)

set(_static_ok OFF)
if(GRADTRACE_STATIC_TOOLS)
  find_library(GT_PROTOBUF_ARCHIVE NAMES libprotobuf.a)
  find_library(GT_ZSTD_ARCHIVE NAMES libzstd.a)
  find_library(GT_RE2_ARCHIVE NAMES libre2.a)
  find_library(GT_ZLIB_ARCHIVE NAMES libz.a)
  if(GT_PROTOBUF_ARCHIVE AND GT_ZSTD_ARCHIVE AND GT_RE2_ARCHIVE AND GT_ZLIB_ARCHIVE)
    set(_static_ok ON)
  else()
    message(STATUS "gradtrace: static protobuf/zstd/re2/zlib archives not all found: the tools link dynamically")
  endif()
endif()

add_library(gt_third_party_static INTERFACE)
if(_static_ok)
  # The headers are the shared libraries' (the same package); the archives in place of the .so files.
  target_include_directories(gt_third_party_static INTERFACE
    $<TARGET_PROPERTY:protobuf::libprotobuf,INTERFACE_INCLUDE_DIRECTORIES> ${ZSTD_INCLUDE_DIRS} ${RE2_INCLUDE_DIRS})
  target_link_libraries(gt_third_party_static INTERFACE
    ${GT_PROTOBUF_ARCHIVE} ${GT_RE2_ARCHIVE} ${GT_ZSTD_ARCHIVE} ${GT_ZLIB_ARCHIVE} Threads::Threads)
else()
  target_link_libraries(gt_third_party_static INTERFACE gt_third_party_shared)
endif()

# What the codec links: the static archives for a target that opted in, the shared libraries otherwise.
add_library(gt_third_party INTERFACE)
target_link_libraries(gt_third_party INTERFACE
  "$<IF:$<BOOL:$<TARGET_PROPERTY:GRADTRACE_STATIC_DEPS>>,gt_third_party_static,gt_third_party_shared>")

function(gradtrace_link_static_tool target)
  if(_static_ok)
    set_target_properties(${target} PROPERTIES GRADTRACE_STATIC_DEPS ON)
  endif()
endfunction()
