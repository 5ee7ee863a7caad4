/*
 * main.c - the `wna16` command: dispatches to one subcommand per file.
 */
#include "cli.h"

#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} commands[] = {
    {"run", cmd_run, "the main job: build a small MoE layer, select, check"},
    {"specs", cmd_specs, "list, validate and explain layout specs"},
    {"select", cmd_select, "which backend vLLM-style selection picks, and why"},
    {"gen", cmd_gen, "print a generated kernel (kernel IR or LLVM IR)"},
    {"repack", cmd_repack, "a checkpoint into a backend's layout (.safetensors)"},
    {"cache", cmd_cache, "kernel cache: entries and size, or clear it"},
    {"fuzz", cmd_fuzz, "generated repack kernels against the reference"},
    {"pack", cmd_pack, "ahead-of-time kernel packs: build, list, verify, extract"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: wna16 <command> [options]\n\n"
               "wna16 %s: a code-generating kernel compiler for weight-only "
               "quantized MoE layers.\n\ncommands:\n", wna16_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'wna16 <command> --help' describes a command.\n"
               "Environment: WNA16_SPEC_DIR adds or replaces specs "
               "(formats/*.json, backends/*.json).\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    if (cli_is_help(argv[1]) || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("wna16 %s\n", wna16_version());
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "wna16: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
