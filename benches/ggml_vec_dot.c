/*
 * llama.cpp's one-token row products, timed as tallow's kernel bench times its own
 * (`matvec_576x1536`: 576 rows of 1536 values against one token, one thread, median time):
 *
 *   cc -O2 -o ggml_vec_dot benches/ggml_vec_dot.c -ldl
 *   ./ggml_vec_dot <llama.cpp>/build/bin/libggml-cpu.so IQ2_XXS IQ3_S ...
 *   TALLOW_NUM_THREADS=1 cargo bench -p tallow-quant --bench kernels -- matvec_576x1536
 *
 * The weights are random bytes with each block's f16 scale set to 1 (a block's values do not
 * change the work of these kernels); the activations are random Q8_K blocks.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*vec_dot_t)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
/* ggml-cpu.h's struct ggml_type_traits_cpu */
struct traits {
    void *from_float;
    vec_dot_t vec_dot;
    int vec_dot_type;
    int64_t nrows;
};

/* ggml type ids, block bytes and where the f16 scale is (-1: none to set) */
static const struct { const char *name; int id, bytes, d_at; } TYPES[] = {
    {"Q2_K", 10, 84, 80},    {"Q3_K", 11, 110, 108},  {"IQ2_XXS", 16, 66, 0},
    {"IQ2_XS", 17, 74, 0},   {"IQ3_XXS", 18, 98, 0},  {"IQ1_S", 19, 50, 0},
    {"IQ3_S", 21, 110, 0},   {"IQ2_S", 22, 82, 0},    {"IQ4_XS", 23, 136, 0},
    {"IQ1_M", 29, 56, -1},   {"TQ1_0", 34, 54, 52},   {"TQ2_0", 35, 66, 64},
};
enum { ROWS = 576, COLS = 1536, RUNS = 2001, Q8K_BYTES = 292 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s libggml-cpu.so TYPE...\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    const struct traits *(*get)(int) = (const struct traits *(*)(int))dlsym(lib, "ggml_get_type_traits_cpu");
    void (*init)(void) = (void (*)(void))dlsym(lib, "ggml_cpu_init");
    init();
    const int nb = COLS / 256;
    uint8_t *y = malloc(nb * Q8K_BYTES);
    srand(1);
    for (int i = 0; i < nb * Q8K_BYTES; i++) y[i] = (uint8_t)(rand() % 200 - 100);
    for (int b = 0; b < nb; b++) {
        float d = 0.01f;
        memcpy(y + b * Q8K_BYTES, &d, 4);
    }
    static double times[RUNS];
    float out[ROWS];
    for (int a = 2; a < argc; a++) {
        int t = -1;
        for (size_t i = 0; i < sizeof TYPES / sizeof *TYPES; i++)
            if (!strcmp(TYPES[i].name, argv[a])) t = (int)i;
        if (t < 0) {
            fprintf(stderr, "unknown type %s\n", argv[a]);
            return 2;
        }
        const int bytes = TYPES[t].bytes;
        uint8_t *w = malloc((size_t)ROWS * nb * bytes);
        for (size_t i = 0; i < (size_t)ROWS * nb * bytes; i++) w[i] = (uint8_t)rand();
        if (TYPES[t].d_at >= 0)
            for (int b = 0; b < ROWS * nb; b++) {
                w[(size_t)b * bytes + TYPES[t].d_at] = 0x00;
                w[(size_t)b * bytes + TYPES[t].d_at + 1] = 0x3c;
            }
        const struct traits *tr = get(TYPES[t].id);
        for (int r = 0; r < RUNS; r++) {
            double t0 = now();
            for (int row = 0; row < ROWS; row++)
                tr->vec_dot(COLS, &out[row], 0, w + (size_t)row * nb * bytes, 0, y, 0, 1);
            times[r] = now() - t0;
        }
        qsort(times, RUNS, sizeof *times, cmp);
        double median = times[RUNS / 2];
        printf("%-8s %8.2f us per product, %.2f ns per 32 values\n", argv[a], median * 1e6,
               median * 1e9 / (ROWS * COLS / 32.0));
        free(w);
    }
    return 0;
}
