/* SHA-256 from OpenSSL's libcrypto, called directly, for the compiled sealing and verifying paths
 * (_leaf.pyx, _chain.pyx, tape/_sealed_entries.pyx), and a buffered writer that hashes JSON text.
 *
 * hashlib's SHA-256 is OpenSSL's too, but each call builds a Python object and an EVP context: for the
 * 65- and 129-byte inputs of a Merkle node and a chain link, that set-up costs more than the hashing.
 * Here the same OpenSSL functions (SHA256_Init/Update/Final, which use the CPU's SHA extensions where
 * it has them) are looked up in the libcrypto that hashlib has already loaded. Where none is found,
 * at_sha256_available() is 0 and the callers use hashlib. tests/test_chain_native.py compares both.
 */
#ifndef AT_SHA256_H
#define AT_SHA256_H

#include <stddef.h>
#include <string.h>

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>

typedef int (*at_sha256_init_fn)(void *ctx);
typedef int (*at_sha256_update_fn)(void *ctx, const void *data, size_t len);
typedef int (*at_sha256_final_fn)(unsigned char *md, void *ctx);

static at_sha256_init_fn at_sha256_init_p = NULL;
static at_sha256_update_fn at_sha256_update_p = NULL;
static at_sha256_final_fn at_sha256_final_p = NULL;

/* 1 when libcrypto's SHA-256 functions were found (call once, after `import hashlib`). */
static inline int at_sha256_available(void) {
    static const char *names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.3.dylib", "libcrypto.dylib", NULL};
    int i;
    if (at_sha256_final_p != NULL)
        return 1;
    for (i = 0; names[i] != NULL; i++) {
        /* only a library the process already holds (hashlib's): never a different copy */
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (lib == NULL)
            continue;
        at_sha256_init_p = (at_sha256_init_fn)dlsym(lib, "SHA256_Init");
        at_sha256_update_p = (at_sha256_update_fn)dlsym(lib, "SHA256_Update");
        at_sha256_final_p = (at_sha256_final_fn)dlsym(lib, "SHA256_Final");
        if (at_sha256_init_p != NULL && at_sha256_update_p != NULL && at_sha256_final_p != NULL)
            return 1;
        at_sha256_init_p = NULL;
        at_sha256_update_p = NULL;
        at_sha256_final_p = NULL;
    }
    return 0;
}

/* A SHA-256 fed in pieces (init, update..., final); only after at_sha256_available() returned 1.
 * SHA256_CTX is 112 bytes in OpenSSL 1.1 and 3.x; room to spare, aligned for its words. */
typedef struct { unsigned long long w[32]; } at_sha_ctx;
static inline void at_ctx_init(at_sha_ctx *c) { at_sha256_init_p(c->w); }
static inline void at_ctx_update(at_sha_ctx *c, const void *d, size_t n) { at_sha256_update_p(c->w, d, n); }
static inline void at_ctx_final(at_sha_ctx *c, unsigned char *out) { at_sha256_final_p(out, c->w); }

/* out = SHA-256(data[0:len]); only after at_sha256_available() returned 1. */
static inline void at_sha256(const unsigned char *data, size_t len, unsigned char *out) {
    at_sha_ctx ctx;
    at_ctx_init(&ctx);
    at_ctx_update(&ctx, data, len);
    at_ctx_final(&ctx, out);
}

/* A hashing writer: bytes gathered in a buffer and fed to SHA-256 a buffer at a time (a piece longer
 * than the buffer is fed in place), so a text written in many small pieces costs a few updates. */
#define AT_HW_BUF 2048
typedef struct {
    at_sha_ctx ctx;
    size_t m;
    unsigned char buf[AT_HW_BUF];
} at_hw;

static inline void at_hw_init(at_hw *w) { at_ctx_init(&w->ctx); w->m = 0; }

static inline void at_hw_put(at_hw *w, const void *d, size_t n) {
    if (w->m + n > AT_HW_BUF) {
        at_ctx_update(&w->ctx, w->buf, w->m);
        w->m = 0;
        if (n >= AT_HW_BUF) {
            at_ctx_update(&w->ctx, d, n);
            return;
        }
    }
    memcpy(w->buf + w->m, d, n);
    w->m += n;
}

static inline void at_hw_final(at_hw *w, unsigned char *out) {
    if (w->m) at_ctx_update(&w->ctx, w->buf, w->m);
    at_ctx_final(&w->ctx, out);
}

/* The UTF-8 text p[0:n] as orjson writes it inside a JSON string: the quote and the backslash
 * escaped, backspace, tab, newline, form feed and carriage return short, other bytes below 0x20 as
 * u00xx, every other byte as it is. */
static const char at_hexd[] = "0123456789abcdef";
static unsigned char at_esc_kind[256];

static inline void at_esc_init(void) {
    int c;
    if (at_esc_kind[0]) return;
    for (c = 0; c < 32; c++) at_esc_kind[c] = 'u';
    at_esc_kind[8] = 'b'; at_esc_kind[9] = 't'; at_esc_kind[10] = 'n'; at_esc_kind[12] = 'f';
    at_esc_kind[13] = 'r';
    at_esc_kind['"'] = '"'; at_esc_kind['\\'] = '\\';
}

static inline void at_hw_escaped(at_hw *w, const unsigned char *p, size_t n) {
    size_t i = 0, run;
    unsigned char e[6];
    at_esc_init();
    while (i < n) {
        run = i;
        while (i < n && !at_esc_kind[p[i]]) i++;
        if (i > run) at_hw_put(w, p + run, i - run);
        if (i < n) {
            unsigned char k = at_esc_kind[p[i]];
            e[0] = '\\';
            if (k == 'u') {
                e[1] = 'u'; e[2] = '0'; e[3] = '0'; e[4] = at_hexd[p[i] >> 4]; e[5] = at_hexd[p[i] & 15];
                at_hw_put(w, e, 6);
            } else {
                e[1] = k;
                at_hw_put(w, e, 2);
            }
            i++;
        }
    }
}

#else

typedef struct { unsigned long long w[32]; } at_sha_ctx;
static inline int at_sha256_available(void) { return 0; }
static inline void at_ctx_init(at_sha_ctx *c) { (void)c; }
static inline void at_ctx_update(at_sha_ctx *c, const void *d, size_t n) { (void)c; (void)d; (void)n; }
static inline void at_ctx_final(at_sha_ctx *c, unsigned char *out) { (void)c; (void)out; }
static inline void at_sha256(const unsigned char *data, size_t len, unsigned char *out) { (void)data; (void)len; (void)out; }
typedef struct { at_sha_ctx ctx; size_t m; } at_hw;
static inline void at_hw_init(at_hw *w) { (void)w; }
static inline void at_hw_put(at_hw *w, const void *d, size_t n) { (void)w; (void)d; (void)n; }
static inline void at_hw_final(at_hw *w, unsigned char *out) { (void)w; (void)out; }
static inline void at_hw_escaped(at_hw *w, const unsigned char *p, size_t n) { (void)w; (void)p; (void)n; }

#endif
#endif
