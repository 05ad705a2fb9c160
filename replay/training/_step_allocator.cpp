/* The step allocator: torch's CPU allocator, in a process that records or replays, for blocks of LARGE_MIN
   bytes and more (a step's activations, products, columns, gradients); smaller ones go to the allocator it
   replaces. Built and installed by replay/training/step_allocator.py.

   Why: a deterministic step allocates the same large float64 temporaries every step. glibc either maps them
   fresh each time (page faults: a third of a small model's step, 2.4x a CNN's) or, tuned to keep them, lets
   them drift apart among the heap's small blocks: a 32x32-image CNN's step held 290 MiB resident for 72 MiB
   of live large blocks, growing step after step. Here they live in segments of their own (mmap), reused best
   fit (the smallest free block that holds the request, the lowest address among equals), split, and merged
   with free neighbours when freed, as CUDA's caching allocator does on a GPU: the same step maps about 1.2x
   its live large blocks (86 MiB for 72), and the next step faults nothing in. Free blocks go back to the
   system (unmapped, a segment cut in two around a hole) on `rp_step_allocator_release` (the end of a run of
   steps) and whenever a new segment cannot be mapped (an address-space cap: the verifier's).

   Nothing numeric depends on it: where a block comes from changes no value. */
#include <c10/core/CPUAllocator.h>
#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <set>
#include <unordered_map>
#include <utility>

namespace {

constexpr size_t LARGE_MIN = size_t(64) << 10;     /* smaller blocks: the replaced allocator's (glibc's heap) */
constexpr size_t LARGE_MAX = size_t(1) << 56;      /* larger ones: the replaced allocator's error (no rounding wraps) */
constexpr size_t SEGMENT_ROUND = size_t(2) << 20;  /* a new segment's size: the request rounded up to this */
constexpr size_t PAGE = 4096;                      /* block sizes and splits: whole pages (alignment, munmap) */
constexpr uint8_t PRIORITY = 1;                    /* over torch's default CPU allocator (0) */

using FreeSet = std::set<std::pair<size_t, uintptr_t>>; /* (size, address): best fit, lowest address first */

/* A block of a segment. Its free-set node is made with it and moved into the set and out again, so that freeing a
   block allocates nothing (a deleter runs where an exception ends the process). */
struct Block {
    char *addr;
    size_t size;
    bool free;
    Block *prev, *next; /* neighbours within its segment, by address */
    FreeSet::node_type node;
};

struct Pool {
    std::mutex mu;
    FreeSet free_blocks;
    std::unordered_map<uintptr_t, Block *> blocks; /* every block of every segment, by address */
    size_t mapped = 0, live = 0, peak_mapped = 0, segments = 0;
    c10::Allocator *replaced = nullptr;
    c10::DeleterFnPtr replaced_raw = nullptr;
};

Pool *pool = nullptr; /* never freed: a tensor may be freed after static destructors ran (interpreter exit) */

/* The address range any segment was ever mapped in, only widened: a pointer outside it (glibc's small blocks, on its
   heap) is the replaced allocator's, known without taking the lock (hundreds of small blocks a step). */
std::atomic<uintptr_t> lowest{UINTPTR_MAX}, highest{0};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
uintptr_t key(const Block *b) { return reinterpret_cast<uintptr_t>(b->addr); }

/* A new block, its node and its place in `blocks` made first (each may throw): nothing changed where one fails. */
Block *new_block(char *addr, size_t size, Block *prev, Block *next) {
    FreeSet scratch;
    Block *b = new Block{addr, size, false, prev, next, scratch.extract(scratch.emplace(0, 0).first)};
    try {
        pool->blocks.emplace(key(b), b);
    } catch (...) {
        delete b;
        throw;
    }
    return b;
}

void mark_free(Block *b) { /* allocates nothing */
    b->free = true;
    b->node.value() = {b->size, key(b)};
    pool->free_blocks.insert(std::move(b->node));
}

void unmark_free(Block *b) {
    b->node = pool->free_blocks.extract({b->size, key(b)});
    b->free = false;
}

/* The best-fitting free block for size bytes, split where more than a page is left over; nullptr if none. */
Block *take(size_t size) {
    auto it = pool->free_blocks.lower_bound({size, 0});
    if (it == pool->free_blocks.end()) return nullptr;
    Block *b = pool->blocks.at(it->second);
    Block *rest = b->size - size >= PAGE ? new_block(b->addr + size, b->size - size, b, b->next) : nullptr;
    unmark_free(b);
    if (rest) {
        if (b->next) b->next->prev = rest;
        b->next = rest, b->size = size;
        mark_free(rest);
    }
    pool->live += b->size;
    return b;
}

/* n, b's next neighbour, merged into b (neither in the free set). */
void merge_into(Block *b, Block *n) {
    pool->blocks.erase(key(n));
    b->size += n->size, b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
}

bool map_segment(size_t size) {
    size_t bytes = round_up(size, SEGMENT_ROUND);
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    Block *b;
    try {
        b = new_block(static_cast<char *>(p), bytes, nullptr, nullptr);
    } catch (const std::bad_alloc &) {
        munmap(p, bytes);
        return false;
    }
    mark_free(b);
    if (key(b) < lowest.load(std::memory_order_relaxed)) lowest.store(key(b), std::memory_order_relaxed);
    if (key(b) + bytes > highest.load(std::memory_order_relaxed)) highest.store(key(b) + bytes, std::memory_order_relaxed);
    pool->mapped += bytes, pool->segments++;
    if (pool->mapped > pool->peak_mapped) pool->peak_mapped = pool->mapped;
    return true;
}

/* Unmap every free block: a whole free segment goes, a hole cuts its segment in two (blocks in use stay put). */
void release_free_blocks() {
    for (auto it = pool->free_blocks.begin(); it != pool->free_blocks.end();) {
        Block *b = pool->blocks.at(it->second);
        it = pool->free_blocks.erase(it);
        if (b->prev && b->next) pool->segments++;
        if (!b->prev && !b->next) pool->segments--;
        if (b->prev) b->prev->next = nullptr;
        if (b->next) b->next->prev = nullptr;
        pool->blocks.erase(key(b));
        munmap(b->addr, b->size);
        pool->mapped -= b->size;
        delete b;
    }
}

/* Every block's deleter (and the raw one): ours back to its segment, merged with free neighbours; any other
   pointer (the replaced allocator's: a small block, a fallback) to the replaced allocator's. Allocates nothing. */
void give_back(void *p) {
    if (!p) return;
    uintptr_t at = reinterpret_cast<uintptr_t>(p);
    if (at >= lowest.load(std::memory_order_relaxed) && at < highest.load(std::memory_order_relaxed)) {
        std::lock_guard<std::mutex> lock(pool->mu);
        auto it = pool->blocks.find(at);
        if (it != pool->blocks.end()) {
            Block *b = it->second;
            if (b->free) {
                std::fprintf(stderr, "step allocator: block %p freed twice\n", p);
                std::abort();
            }
            c10::profiledCPUMemoryReporter().Delete(p);
            pool->live -= b->size;
            if (b->next && b->next->free) {
                Block *n = b->next;
                unmark_free(n);
                merge_into(b, n);
            }
            if (b->prev && b->prev->free) {
                Block *prev = b->prev;
                unmark_free(prev);
                merge_into(prev, b);
                b = prev;
            }
            mark_free(b);
            return;
        }
    }
    pool->replaced_raw(p);
}

struct StepAllocator final : c10::Allocator {
    c10::DataPtr allocate(size_t n) override {
        if (n < LARGE_MIN || n > LARGE_MAX) return replaced(n);
        size_t size = round_up(n, PAGE);
        Block *b = nullptr;
        {
            std::lock_guard<std::mutex> lock(pool->mu);
            b = take(size);
            if (!b && !map_segment(size)) {
                release_free_blocks(); /* under an address-space cap (the verifier's): room for this one */
                map_segment(size);
            }
            if (!b) b = take(size);
        }
        if (!b) return replaced(n); /* its own error where it cannot either */
        c10::profiledCPUMemoryReporter().New(b->addr, n);
        return {b->addr, b->addr, &give_back, c10::Device(c10::DeviceType::CPU)};
    }

    /* The replaced allocator's block, with give_back as its deleter (where the replaced one has a raw interface):
       every block this allocator returns carries its raw deleter, as the interface promises. */
    static c10::DataPtr replaced(size_t n) {
        if (!pool->replaced_raw) return pool->replaced->allocate(n);
        void *p = pool->replaced->raw_allocate(n);
        return {p, p, &give_back, c10::Device(c10::DeviceType::CPU)};
    }

    c10::DeleterFnPtr raw_deleter() const override { return pool->replaced_raw ? &give_back : nullptr; }

    void copy_data(void *dest, const void *src, std::size_t count) const override {
        default_copy_data(dest, src, count);
    }
};

void lock_for_fork() { pool->mu.lock(); } /* a forked child (a Celery pool) must not inherit a held lock */
void unlock_after_fork() { pool->mu.unlock(); }

}  // namespace

extern "C" {

/* Install as torch's CPU allocator: 1 now, 0 already, -1 where another allocator of higher priority is set. */
int rp_step_allocator_install(void) {
    if (pool) return c10::GetCPUAllocator() == pool->replaced ? -1 : 0;
    pool = new Pool;
    pool->replaced = c10::GetCPUAllocator();
    pool->replaced_raw = pool->replaced->raw_deleter();
    auto *mine = new StepAllocator;
    c10::SetCPUAllocator(mine, PRIORITY);
    if (c10::GetCPUAllocator() != mine) return -1;
    pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
    return 1;
}

/* Unmap every free block (its pages go back to the system); blocks in use stay. */
void rp_step_allocator_release(void) {
    if (!pool) return;
    std::lock_guard<std::mutex> lock(pool->mu);
    release_free_blocks();
}

/* [mapped bytes, bytes in live blocks, segments, peak mapped bytes, free blocks, LARGE_MIN] */
void rp_step_allocator_stats(int64_t *out) {
    for (int i = 0; i < 5; i++) out[i] = 0;
    out[5] = (int64_t)LARGE_MIN;
    if (!pool) return;
    std::lock_guard<std::mutex> lock(pool->mu);
    out[0] = (int64_t)pool->mapped, out[1] = (int64_t)pool->live, out[2] = (int64_t)pool->segments;
    out[3] = (int64_t)pool->peak_mapped, out[4] = (int64_t)pool->free_blocks.size();
}

/* Walk every segment: 0 where the invariants hold, else the first that fails. 1: neighbours' links; 2: a block not
   ending where its next one starts; 3: two free neighbours (not merged); 4: the free set and the free flags
   disagree (or a block holds its node while in the set); 5: the blocks' sizes do not add up to the bytes mapped; 6: nor the live ones to the live bytes;
   7: segments miscounted; 8: a block not page-aligned. */
int rp_step_allocator_check(void) {
    if (!pool) return 0;
    std::lock_guard<std::mutex> lock(pool->mu);
    size_t mapped = 0, live = 0, segments = 0, free_count = 0;
    for (const auto &entry : pool->blocks) {
        const Block *b = entry.second;
        if (reinterpret_cast<uintptr_t>(b->addr) % PAGE || b->size % PAGE) return 8;
        if (b->next && (b->next->prev != b)) return 1;
        if (b->next && b->addr + b->size != b->next->addr) return 2;
        if (b->next && b->free && b->next->free) return 3;
        if (b->free != (pool->free_blocks.count({b->size, entry.first}) == 1) || b->free == !b->node.empty()) return 4;
        mapped += b->size, live += b->free ? 0 : b->size, segments += !b->prev, free_count += b->free;
    }
    if (mapped != pool->mapped) return 5;
    if (live != pool->live) return 6;
    if (segments != pool->segments) return 7;
    return free_count == pool->free_blocks.size() ? 0 : 4;
}

}  // extern "C"
