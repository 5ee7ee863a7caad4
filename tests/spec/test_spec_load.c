/* test_spec_load - being written. */
#include "testutil.h"
int main(void) { return tu_finish("test_spec_load"); }
