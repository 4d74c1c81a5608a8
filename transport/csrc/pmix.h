/* The PMIx client calls the bootstrap uses (bindgen input for the `pmix` feature). */
#include <pmix.h>
