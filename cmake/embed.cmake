# Compiles data files into the library as tables of {origin, text, length}
# (cmake/embed_run.cmake), so an installed `wna16` needs no spec or template
# directory. A generated file is rebuilt when any of its inputs changes.

function(wna16_embed out_file root glob table type header)
  file(GLOB_RECURSE files CONFIGURE_DEPENDS "${root}/${glob}")
  list(SORT files)
  set(out "${CMAKE_CURRENT_BINARY_DIR}/${out_file}")
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DROOT=${root} -DOUT=${out} "-DFILES=${files}"
            -DTABLE=${table} -DTYPE=${type} -DHEADER=${header}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed_run.cmake
    DEPENDS ${files} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed_run.cmake
    COMMENT "Embedding ${root}/${glob}"
    VERBATIM)
endfunction()

# Every specs/**/*.json as w16_embedded_specs (spec/spec.h).
function(wna16_embed_specs out_var spec_root)
  wna16_embed(embedded_specs.c ${spec_root} "*.json" w16_embedded_specs
              w16_embedded_spec_t spec/spec.h)
  set(${out_var} ${CMAKE_CURRENT_BINARY_DIR}/embedded_specs.c PARENT_SCOPE)
endfunction()

# Every templates/*.cu (the CUDA C kernel skeletons the generator
# specializes) as w16_embedded_templates (gen/templates.h).
function(wna16_embed_templates out_var template_root)
  wna16_embed(embedded_templates.c ${template_root} "*.cu"
              w16_embedded_templates w16_embedded_template_t gen/templates.h)
  set(${out_var} ${CMAKE_CURRENT_BINARY_DIR}/embedded_templates.c PARENT_SCOPE)
endfunction()
