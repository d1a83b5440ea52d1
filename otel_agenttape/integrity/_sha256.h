/* SHA-256 from OpenSSL's libcrypto, called directly, for the compiled sealing path (_leaf.pyx, _chain.pyx).
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

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>

typedef int (*at_sha256_init_fn)(void *ctx);
typedef int (*at_sha256_update_fn)(void *ctx, const void *data, size_t len);
typedef int (*at_sha256_final_fn)(unsigned char *md, void *ctx);

static at_sha256_init_fn at_sha256_init_p = NULL;
static at_sha256_update_fn at_sha256_update_p = NULL;
static at_sha256_final_fn at_sha256_final_p = NULL;

/* 1 when libcrypto's SHA-256 functions were found (call once, after `import hashlib`). */
static int at_sha256_available(void) {
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
static void at_ctx_init(at_sha_ctx *c) { at_sha256_init_p(c->w); }
static void at_ctx_update(at_sha_ctx *c, const void *d, size_t n) { at_sha256_update_p(c->w, d, n); }
static void at_ctx_final(at_sha_ctx *c, unsigned char *out) { at_sha256_final_p(out, c->w); }

/* out = SHA-256(data[0:len]); only after at_sha256_available() returned 1. */
static void at_sha256(const unsigned char *data, size_t len, unsigned char *out) {
    at_sha_ctx ctx;
    at_ctx_init(&ctx);
    at_ctx_update(&ctx, data, len);
    at_ctx_final(&ctx, out);
}

#else

typedef struct { unsigned long long w[32]; } at_sha_ctx;
static int at_sha256_available(void) { return 0; }
static void at_ctx_init(at_sha_ctx *c) { (void)c; }
static void at_ctx_update(at_sha_ctx *c, const void *d, size_t n) { (void)c; (void)d; (void)n; }
static void at_ctx_final(at_sha_ctx *c, unsigned char *out) { (void)c; (void)out; }
static void at_sha256(const unsigned char *data, size_t len, unsigned char *out) { (void)data; (void)len; (void)out; }

#endif
#endif
