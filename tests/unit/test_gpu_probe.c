/*
 * test_gpu_probe.c - on a machine with a CUDA GPU, the device probe finds
 * it through the driver (dlopen, no link dependency) and reports its
 * compute capability. Skips (77) without a GPU, saying why none was found.
 */
#include "testutil.h"

#include <string.h>

int main(void)
{
    wna16_device_info_t d;
    wna16_probe_device(&d);
    if (d.platform != WNA16_PLATFORM_CUDA) {
        char why[700];
        snprintf(why, sizeof why, "no CUDA GPU: %s", d.notes);
        tu_skip(why);
    }
    printf("found %s, compute capability %d.%d\n", d.name, d.cc_major,
           d.cc_minor);
    TU_CHECK(d.cc_major >= 7);
    TU_CHECK(strlen(d.name) > 0);
    return tu_finish("test_gpu_probe");
}
