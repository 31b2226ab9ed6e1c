/* The plain paged read of bench/attention_read.c under other prefetch schedules: whether the scattered
 * read's distance from the floor is a matter of asking for lines earlier, later or into another cache
 * (docs/bench-kernels.md, seventh run).
 *
 * Pools as attention_read.c builds them (30 layers, K and V, 16-token blocks of 3 kv heads x 64 dims in
 * f16, 1 GiB on 2 MiB pages), the 4,000-token context's blocks scattered at random. Each thread reads
 * its half of a layer's blocks, K then V, with 256-bit loads, and with every 64 bytes read asks for the
 * next LINES cache lines of the block DIST blocks ahead (HINT 0-3: prefetcht0, t1, t2, nta; 4: no
 * prefetch). Each schedule is timed after a 256 MiB read that empties the caches, and divided by that
 * read's time for the same bytes (the floor); prints the median ratio of 11 rounds per schedule.
 *
 *     gcc -O3 -march=native -fopenmp -std=c11 bench/scatter_read.c -o /tmp/scatter_read
 *     /tmp/scatter_read 2  1 1 1  1 4 1  2 1 1  4 1 1  1 0 1  1 2 1  1 3 1  1 1 2   # THREADS (DIST HINT LINES)...
 */
#include "read_floor.h"

enum { LAYERS = 30, HKV = 3, D = 64, B = 16, CTX = 4000, ROUNDS = 11, MAX_SCHEDULES = 16 };

typedef struct {
    int dist, hint, lines;
} schedule;

static inline void ask(const char *line, int hint) {
    switch (hint) {
    case 0: _mm_prefetch(line, _MM_HINT_T0); break;
    case 1: _mm_prefetch(line, _MM_HINT_T1); break;
    case 2: _mm_prefetch(line, _MM_HINT_T2); break;
    case 3: _mm_prefetch(line, _MM_HINT_NTA); break;
    default: break;
    }
}

/* One thread's blocks [lo, hi) of a layer, K then V, under schedule `s`. */
static int64_t read_blocks(const char *k, const char *v, const int32_t *table, int lo, int hi, schedule s) {
    const size_t blk = (size_t)B * HKV * D * 2;
    __m256i acc = _mm256_setzero_si256();
    for (int kv = 0; kv < 2; kv++) {
        const char *base = kv ? v : k;
        int next = lo + s.dist; /* the block and byte of the next line to ask for */
        size_t at = 0;
        for (int i = lo; i < hi; i++) {
            const char *p = base + (size_t)table[i] * blk;
            for (size_t o = 0; o < blk; o += 32) {
                for (int x = 0; o % 64 == 0 && s.hint < 4 && x < s.lines && next < hi; x++) {
                    ask(base + (size_t)table[next] * blk + at, s.hint);
                    if ((at += 64) == blk) {
                        at = 0;
                        next++;
                    }
                }
                acc = _mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)(p + o)));
            }
        }
    }
    return _mm256_extract_epi32(acc, 0);
}

int main(int argc, char **argv) {
    const int n_sched = (argc - 2) / 3;
    if (argc < 5 || (argc - 2) % 3 != 0 || n_sched > MAX_SCHEDULES) {
        fprintf(stderr, "usage: %s THREADS DIST HINT LINES [DIST HINT LINES ...] (at most %d schedules)\n", argv[0],
                MAX_SCHEDULES);
        return 2;
    }
    const int threads = atoi(argv[1]);
    schedule sched[MAX_SCHEDULES];
    for (int c = 0; c < n_sched; c++) {
        sched[c] = (schedule){atoi(argv[2 + 3 * c]), atoi(argv[3 + 3 * c]), atoi(argv[4 + 3 * c])};
        if (sched[c].dist < 1 || sched[c].hint < 0 || sched[c].hint > 4 || sched[c].lines < 1) {
            fprintf(stderr, "schedule %d: DIST >= 1, HINT 0-4 and LINES >= 1\n", c + 1);
            return 2;
        }
    }
    const int nb = (CTX + B - 1) / B;
    const size_t blk = (size_t)B * HKV * D * 2, pool = ((size_t)1 << 30) / (2 * LAYERS * blk);
    char *pools = huge_alloc(2 * LAYERS * pool * blk, 1);
    int32_t *ids = malloc(pool * sizeof(int32_t));
    if (ids == NULL) return 1;
    for (size_t i = 0; i < pool; i++) ids[i] = (int32_t)i;
    srand(3);
    for (size_t i = pool - 1; i > 1; i--) { /* block 0 stays the null block */
        const size_t j = 1 + (size_t)rand() % i;
        const int32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    const int32_t *table = ids + 1;
    const size_t big_bytes = (size_t)256 << 20, kv_bytes = 2 * LAYERS * (size_t)CTX * HKV * D * 2;
    char *big = huge_alloc(big_bytes, 1);
    static double ratio[MAX_SCHEDULES][ROUNDS];
    volatile int64_t sink = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (int c = 0; c < n_sched; c++) {
            double t0 = now();
            sink += read_all(big, big_bytes, threads);
            const double floor_s = (now() - t0) * (double)kv_bytes / (double)big_bytes;
            t0 = now();
            for (int l = 0; l < LAYERS; l++) {
                const char *k = pools + (size_t)(2 * l) * pool * blk, *v = pools + (size_t)(2 * l + 1) * pool * blk;
#pragma omp parallel num_threads(threads)
                {
                    const int me = omp_get_thread_num(), n = omp_get_num_threads();
                    const int64_t s = read_blocks(k, v, table, nb * me / n, nb * (me + 1) / n, sched[c]);
#pragma omp atomic
                    sink += s;
                }
            }
            ratio[c][r] = (now() - t0) / floor_s;
        }
    printf("%d threads, %d tokens, 16-token blocks scattered over 1 GiB, %d rounds\n", threads, CTX, ROUNDS);
    for (int c = 0; c < n_sched; c++)
        printf("  dist %d hint %d lines %d: %.2fx the floor\n", sched[c].dist, sched[c].hint, sched[c].lines,
               median(ratio[c], ROUNDS));
    return 0;
}
