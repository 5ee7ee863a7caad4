# Compiles every specs/**/*.json into the library as a table of
# {origin, text, length}, so an installed `wna16` needs no spec directory.
# The generated file is rebuilt when any spec changes.

function(wna16_embed_specs out_var spec_root)
  file(GLOB_RECURSE specs CONFIGURE_DEPENDS "${spec_root}/*.json")
  list(SORT specs)
  set(out "${CMAKE_CURRENT_BINARY_DIR}/embedded_specs.c")
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DSPEC_ROOT=${spec_root} -DOUT=${out}
            "-DSPECS=${specs}" -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed_run.cmake
    DEPENDS ${specs} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed_run.cmake
    COMMENT "Embedding ${spec_root} specs"
    VERBATIM)
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()
