/* Compiled core of seer/dgds/tree/suffix_tree.py: the whole group tree in C, appends and drafting.
 *
 * `Tree` holds the same tree as the pure-Python `SuffixTree` (same nodes, counts, edge references;
 * suffix_tree.py's `_extend` is the reference, and tests require identical trees after every call)
 * but in plain C arrays: nodes are 56-byte structs in one array, indexed by int32 ids; a node's
 * children form a doubly linked sibling list, and the children of a node with more than SCAN_MAX
 * of them are also in one open-addressing hash table per tree, keyed by (parent id, token). The
 * tokens of each sequence are kept twice: as int64 arrays (what the tree reads) and as the Python
 * lists `SuffixTree.seqs` shows (what the rest of seer/dgds reads).
 *
 * `Tree.draft` is drafting.py's `draft` (match the longest continuing suffix by binary search, then
 * the greedy walk with the probability floor, or the top-k beam) on these nodes; tests compare its
 * drafts with the Python implementation's, token for token and probability for probability.
 *
 * A tree made with `Tree(max_depth, log=True)` (the draft server's) also keeps its append log: per
 * extend call a segment (sequence, start, length) and the tokens as uint32, in order. `append_at`
 * appends a slice of a packed little-endian uint32 buffer when it continues its sequence, and
 * `log_fetch` answers the fetches of a whole packed Sync message (many trees, from each one's log
 * offset) as two byte strings. `Tree(max_depth, log=True, lazy=True)` defers the tree itself: its
 * extends keep only the tokens and the log, and the first read of the tree (a draft, count, dump or
 * num_nodes) builds it by replaying the log in order, which gives the very nodes an eager tree has
 * (see materialize()); a draft server whose clients all draft from their own replicas then never
 * pays for a tree it would not read. `sync_packed` does a whole serialized Sync message of the draft
 * server (GroupStore.sync: parse, fetches, appends, the serialized answer) with no Python step per
 * group, append, segment or token. suffix_tree.py holds the same in Python, the reference.
 *
 * No Python object is made per node, so trees are invisible to the cyclic GC and freed at once.
 * Only public C API is used (no object layouts). Built by `pip install -e .` (setup.py), which
 * compiles in SEER_CORE_SOURCE_SHA256, the SHA-256 of this file: suffix_tree.py compares it with
 * the source next to it and refuses a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef SCAN_MAX
#define SCAN_MAX 4 /* up to this many children: found by scanning the sibling list, not hashed */
#endif
#define NONE (-1)
#ifndef SEER_CORE_SOURCE_SHA256
#define SEER_CORE_SOURCE_SHA256 "unknown" /* not built by setup.py: suffix_tree.py treats it as stale */
#endif

typedef struct {
    int64_t tok;     /* first token of the edge: the key under the parent (root: unused) */
    int64_t count;   /* windows that end at or pass through the node */
    int32_t length;  /* edge length; an open leaf's (growing) is not kept: see elen() */
    int32_t ref_seq; /* the edge is seqs[ref_seq][ref_idx : ref_idx + length] */
    int32_t ref_idx;
    int32_t parent;
    int32_t first;       /* first child, NONE for a leaf */
    int32_t next, prev;  /* siblings */
    int32_t nkids;       /* number of children */
    int32_t growing;     /* an open leaf (see suffix_tree.Node.growing), or one that stopped at limit */
    int32_t limit;       /* an open leaf's window is max_depth long once its sequence is this long */
} CNode;

typedef struct {
    int64_t tok;
    int32_t parent;
    int32_t child; /* NONE: empty slot */
} Entry;

typedef struct {
    int64_t *tok; /* the tokens */
    int32_t len, cap;
    int32_t *act; /* act[astart : astart + na]: where its growing windows end (oldest first) */
    int32_t astart, na;
    int32_t lo; /* act[astart : astart + lo] are open leaves */
    PyObject *list; /* the Python list SuffixTree.seqs shows (a strong reference) */
} Seq;

typedef struct {
    PyObject_HEAD
    int32_t max_depth;
    CNode *nodes;
    int32_t nodes_cap, nodes_top, free_head; /* slots [0, nodes_top) used or on the free list */
    int64_t num_nodes;
    Entry *tab;
    uint64_t mask; /* capacity - 1 (capacity a power of two), or 0 with tab NULL */
    int64_t tab_used;
    Seq *seqs;
    int32_t nseqs, seqs_cap;
    PyObject *pyseqs; /* list of the sequences' lists */
    uint64_t version; /* bumped by every extend (SuffixTree caches its node view on it) */
    int32_t *scratch; /* max_depth + 1 ints: step()'s per-window lookup state */
    uint64_t mark;    /* sync_packed's: seen in this message */
    int log_on;       /* keep the append log (Tree(log=True)) */
    int64_t *log_seg; /* 4 per segment: sequence, start, length, tokens of the log up to its end */
    int64_t log_n, log_cap;
    uint32_t *log_tok; /* the segments' tokens, in order */
    int64_t log_ntok, log_tokcap;
    int deferred;  /* Tree(log=True, lazy=True) before its first read: tokens and log only, no nodes */
    double ttl, expires_at; /* the draft server's lease of the group (GroupState's; renewed by sync_packed) */
    int lists_deferred; /* a lazy tree's: the sequences' Python lists stay empty until `seqs` is read */
    int64_t ntok;  /* tokens in all sequences (the root's count once the tree is built) */
    uint64_t pmark; /* sync_packed's limit pre-pass: this message's plan of the tree (see there) */
    int64_t pntok, pnseq, pbuf;
} Tree;

static PyObject *draft_path_type = NULL; /* seer.dgds.types.DraftPath, set by bind() */
static PyObject *s_tokens, *s_probs, *s_max_spec, *s_lmin, *s_lmax, *s_topk, *s_floor;

/* ---- hash table of the children of big nodes ------------------------------------------------ */

static inline uint64_t hkey(int32_t parent, int64_t tok) {
    uint64_t x = (uint64_t)tok * 0x9E3779B97F4A7C15ull + (uint64_t)(uint32_t)parent;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return x;
}

static int32_t hash_find(Tree *t, int32_t parent, int64_t tok) {
    uint64_t i = hkey(parent, tok) & t->mask;
    for (;;) {
        Entry *e = &t->tab[i];
        if (e->child == NONE) return NONE;
        if (e->tok == tok && e->parent == parent) return e->child;
        i = (i + 1) & t->mask;
    }
}

/* insert a key known to be absent; the table has room (hash_reserve) */
static void hash_put(Tree *t, int32_t parent, int64_t tok, int32_t child) {
    uint64_t i = hkey(parent, tok) & t->mask;
    while (t->tab[i].child != NONE) i = (i + 1) & t->mask;
    t->tab[i].tok = tok;
    t->tab[i].parent = parent;
    t->tab[i].child = child;
    t->tab_used++;
}

static Entry *hash_slot(Tree *t, int32_t parent, int64_t tok) {
    uint64_t i = hkey(parent, tok) & t->mask;
    for (;;) {
        Entry *e = &t->tab[i];
        if (e->child == NONE) return NULL;
        if (e->tok == tok && e->parent == parent) return e;
        i = (i + 1) & t->mask;
    }
}

static void hash_del(Tree *t, int32_t parent, int64_t tok) {
    Entry *e = hash_slot(t, parent, tok);
    if (e == NULL) return;
    uint64_t i = (uint64_t)(e - t->tab), j = i;
    for (;;) { /* backward-shift deletion (linear probing keeps no tombstones) */
        j = (j + 1) & t->mask;
        Entry *f = &t->tab[j];
        if (f->child == NONE) break;
        uint64_t k = hkey(f->parent, f->tok) & t->mask;
        if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
            t->tab[i] = *f;
            i = j;
        }
    }
    t->tab[i].child = NONE;
    t->tab_used--;
}

/* room for `extra` more entries at load <= 1/2 */
static int hash_reserve(Tree *t, int64_t extra) {
    uint64_t cap = t->tab ? t->mask + 1 : 0;
    if ((uint64_t)(t->tab_used + extra) * 2 <= cap) return 0;
    uint64_t ncap = cap ? cap : 64;
    while ((uint64_t)(t->tab_used + extra) * 2 > ncap) ncap *= 2;
    Entry *old = t->tab;
    Entry *tab = PyMem_Malloc(ncap * sizeof(Entry));
    if (tab == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < ncap; i++) tab[i].child = NONE;
    t->tab = tab;
    t->mask = ncap - 1;
    t->tab_used = 0;
    for (uint64_t i = 0; i < cap; i++)
        if (old[i].child != NONE) hash_put(t, old[i].parent, old[i].tok, old[i].child);
    PyMem_Free(old);
    return 0;
}

/* ---- nodes and their children ----------------------------------------------------------------- */

#define ND(i) (t->nodes[(i)])
#define PREFETCH(p) __builtin_prefetch((p), 1, 3)

/* A node's edge length. An open leaf (growing) ends where its sequence ends, until its window is
 * max_depth long (limit), so its length is computed, not stored: an append then never touches the
 * open leaves of its sequence, not even the one whose window stops. */
static inline int32_t elen(const Tree *t, const CNode *n) {
    if (!n->growing) return n->length;
    int32_t len = t->seqs[n->ref_seq].len;
    return (len < n->limit ? len : n->limit) - n->ref_idx;
}

/* Whether a node is an open leaf in SuffixTree's sense (its window still growing). */
static inline int is_open(const Tree *t, const CNode *n) {
    return n->growing && t->seqs[n->ref_seq].len <= n->limit;
}

/* room for `extra` more nodes and their hash entries (checked before each token, so that a step
 * never fails midway; new nodes come from the free list first, then from [nodes_top, nodes_cap)) */
static int reserve_slow(Tree *t, int32_t extra) {
    if ((int64_t)t->nodes_top + extra > t->nodes_cap) {
        int64_t ncap = t->nodes_cap ? (int64_t)t->nodes_cap * 2 : 64;
        while (ncap < (int64_t)t->nodes_top + extra) ncap *= 2;
        if (ncap > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "suffix tree: more than 2**31 nodes");
            return -1;
        }
        CNode *nodes = PyMem_Realloc(t->nodes, (size_t)ncap * sizeof(CNode));
        if (nodes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->nodes = nodes;
        t->nodes_cap = (int32_t)ncap;
    }
    /* a node crossing SCAN_MAX children hashes all of them at once */
    return hash_reserve(t, (int64_t)extra * (SCAN_MAX + 1));
}

static inline int reserve(Tree *t, int32_t extra) {
    if ((int64_t)t->nodes_top + extra <= t->nodes_cap && t->tab != NULL &&
        (uint64_t)(t->tab_used + (int64_t)extra * (SCAN_MAX + 1)) * 2 <= t->mask + 1)
        return 0;
    return reserve_slow(t, extra);
}

static int32_t new_node(Tree *t, int64_t tok, int64_t count, int32_t length, int32_t ref_seq, int32_t ref_idx,
                        int32_t parent) {
    int32_t id;
    if (t->free_head != NONE) {
        id = t->free_head;
        t->free_head = ND(id).next;
    } else {
        id = t->nodes_top++;
    }
    CNode *n = &ND(id);
    n->tok = tok;
    n->count = count;
    n->length = length;
    n->ref_seq = ref_seq;
    n->ref_idx = ref_idx;
    n->parent = parent;
    n->first = n->next = n->prev = NONE;
    n->nkids = 0;
    n->growing = count == 1;
    n->limit = INT32_MAX;
    return id;
}

static void free_node(Tree *t, int32_t id) {
    ND(id).next = t->free_head;
    ND(id).count = 0;
    t->free_head = id;
}

static inline int32_t child_find(Tree *t, int32_t p, int64_t tok) {
    if (ND(p).nkids > SCAN_MAX) return hash_find(t, p, tok);
    for (int32_t c = ND(p).first; c != NONE; c = ND(c).next)
        if (ND(c).tok == tok) return c;
    return NONE;
}

/* c (ND(c).tok set, in no sibling list) becomes a child of p; the table has room (reserve) */
static void child_add(Tree *t, int32_t p, int32_t c) {
    CNode *pn = &ND(p);
    ND(c).next = pn->first;
    ND(c).prev = NONE;
    if (pn->first != NONE) ND(pn->first).prev = c;
    pn->first = c;
    pn->nkids++;
    if (pn->nkids == SCAN_MAX + 1) {
        for (int32_t k = pn->first; k != NONE; k = ND(k).next) hash_put(t, p, ND(k).tok, k);
    } else if (pn->nkids > SCAN_MAX + 1) {
        hash_put(t, p, ND(c).tok, c);
    }
}

/* `nw` (not in any list, same first token) takes the place of p's child `old` */
static void child_replace(Tree *t, int32_t p, int32_t old, int32_t nw) {
    CNode *o = &ND(old), *n = &ND(nw);
    n->prev = o->prev;
    n->next = o->next;
    if (o->prev != NONE) ND(o->prev).next = nw;
    else ND(p).first = nw;
    if (o->next != NONE) ND(o->next).prev = nw;
    o->prev = o->next = NONE;
    if (ND(p).nkids > SCAN_MAX) hash_slot(t, p, n->tok)->child = nw;
}

/* p's child c is now keyed by newtok */
static void child_rekey(Tree *t, int32_t p, int32_t c, int64_t newtok) {
    if (ND(p).nkids > SCAN_MAX) {
        hash_del(t, p, ND(c).tok);
        hash_put(t, p, newtok, c);
    }
    ND(c).tok = newtok;
}

/* ---- appends -------------------------------------------------------------------------------- */

/* One token for every window of sequence `sid` (SuffixTree._extend, line for line). The caller has
 * reserved room for the token, max_depth + 1 nodes and their hash entries: nothing here fails. */
static void step(Tree *t, int32_t sid, int64_t tok) {
    Seq *s = &t->seqs[sid];
    const int32_t root = 0, n = s->len, end = n + 1;
    int32_t lo = s->lo;
    /* active.append(root) */
    if (s->astart + s->na == 2 * (t->max_depth + 1)) {
        memmove(s->act, s->act + s->astart, (size_t)s->na * sizeof(int32_t));
        s->astart = 0;
    }
    s->act[s->astart + s->na++] = root;
    ND(root).count++;
    if (s->na > t->max_depth) {
        /* The oldest window is max_depth long: it stops growing (its leaf's length: see elen). */
        if (lo) lo--;
        s->astart++;
        s->na--;
    }
    s->tok[s->len++] = tok;
    int32_t *act = s->act + s->astart;
    const int32_t na = s->na;
    int64_t created = 0;
    /* Each window's child lookup is a chain of cache misses (a big tree is far larger than the
     * caches); the windows' chains are independent, so walk them all a hop at a time first, with
     * prefetches, and the lookups below find their lines in cache. Only a warm-up: the loop below
     * looks everything up again, since earlier windows may change the tree under later ones. */
    int32_t *cur = t->scratch;
    int walking = 0;
    for (int32_t i = lo; i < na; i++) {
        const CNode *nd = &ND(act[i]);
        if (nd->nkids > SCAN_MAX) {
            PREFETCH(&t->tab[hkey(act[i], tok) & t->mask]);
            cur[i] = -2; /* hashed children: the slot first */
            walking = 1;
        } else {
            cur[i] = nd->first;
            if (cur[i] != NONE) {
                PREFETCH(&ND(cur[i]));
                walking = 1;
            }
        }
    }
    while (walking) {
        walking = 0;
        for (int32_t i = lo; i < na; i++) {
            int32_t c = cur[i];
            if (c == NONE) continue;
            if (c < NONE) {
                cur[i] = c = hash_find(t, act[i], tok);
                if (c != NONE) {
                    PREFETCH(&ND(c));
                    walking = 1;
                }
                continue;
            }
            if (ND(c).tok != tok) {
                cur[i] = ND(c).next;
                if (cur[i] != NONE) {
                    PREFETCH(&ND(cur[i]));
                    walking = 1;
                }
                continue;
            }
            cur[i] = NONE;
            if (c == NONE) continue;
            /* found: what a split or a moved boundary reads and writes next */
            const CNode *cn = &ND(c);
            PREFETCH(cn);
            PREFETCH(&t->seqs[cn->ref_seq].tok[cn->ref_idx + 1]);
            if (cn->next != NONE) PREFETCH(&ND(cn->next));
            if (cn->prev != NONE) PREFETCH(&ND(cn->prev));
        }
    }
    for (int32_t i = lo; i < na; i++) {
        int32_t node = act[i];
        int32_t child = child_find(t, node, tok);
        if (child == NONE) {
            /* a leaf other windows ended at too, or a node without this continuation: the window
             * branches off (a non-root node here has count >= 2) */
            int32_t nw = new_node(t, tok, 1, 1, sid, n, node);
            int64_t limit = (int64_t)n - (na - 1 - i) + t->max_depth; /* (window i starts na - 1 - i before n) */
            ND(nw).limit = limit < INT32_MAX ? (int32_t)limit : INT32_MAX;
            child_add(t, node, nw);
            act[i] = nw;
            created++;
            continue;
        }
        CNode *c = &ND(child), *nd = &ND(node);
        int32_t clen = elen(t, c); /* (an open leaf of this sequence: end - c->ref_idx) */
        if (nd->count == c->count + 1 && node != root) {
            /* This window ends at `node`, and every other window through `node` continues with
             * `tok` (so `child` is its only child). */
            if (clen == 1) {
                /* The boundary reaches `child`: `child` absorbs `node`. */
                int32_t parent = nd->parent;
                c->count++;
                c->length = nd->length + 1;
                c->ref_seq = sid;
                c->ref_idx = end - c->length;
                c->parent = parent;
                c->growing = 0;
                c->tok = nd->tok;
                if (nd->nkids > SCAN_MAX) hash_del(t, node, tok); /* (not with SCAN_MAX >= 1) */
                nd->first = NONE;
                nd->nkids = 0;
                child_replace(t, parent, node, child);
                free_node(t, node);
                act[i] = child;
                created--;
            } else {
                /* The node boundary moves one token down. */
                int32_t length = nd->length + 1;
                nd->length = length;
                nd->ref_seq = sid;
                nd->ref_idx = end - length;
                c->length = clen - 1;
                c->ref_idx++;
                int64_t head = t->seqs[c->ref_seq].tok[c->ref_idx];
                if (head != tok) child_rekey(t, node, child, head);
            }
        } else if (clen == 1) {
            c->count++;
            c->growing = 0;
            c->length = 1;
            act[i] = child;
        } else {
            /* Split `child` after its first token; the window ends at the split point. */
            int32_t mid = new_node(t, tok, c->count + 1, 1, sid, n, node);
            c = &ND(child); /* (no reallocation: reserved, but keep the habit) */
            c->length = clen - 1;
            c->ref_idx++;
            c->parent = mid;
            c->tok = t->seqs[c->ref_seq].tok[c->ref_idx];
            child_replace(t, node, child, mid);
            child_add(t, mid, child);
            act[i] = mid;
            created++;
        }
    }
    /* Windows that now reached a leaf of their own join the open prefix. */
    while (lo < na && ND(act[lo]).count == 1) lo++;
    s->lo = lo;
    t->num_nodes += created;
}

/* The int64 value of a token (an int, or anything with __index__); -1 and an error on failure. */
static int token_value(PyObject *item, int64_t *out, PyObject **as_int) {
    PyObject *v;
    if (PyLong_CheckExact(item)) {
        v = Py_NewRef(item);
    } else {
        v = PyNumber_Index(item);
        if (v == NULL) return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_OverflowError, "token id out of the int64 range");
        Py_DECREF(v);
        return -1;
    }
    *out = x;
    *as_int = v;
    return 0;
}

/* Room in the log for one more segment of n tokens; -1 and MemoryError if not. */
static int log_reserve(Tree *t, Py_ssize_t n) {
    if (t->log_n + 1 > t->log_cap) {
        int64_t ncap = t->log_cap ? 2 * t->log_cap : 64;
        int64_t *seg = PyMem_Realloc(t->log_seg, (size_t)ncap * 4 * sizeof(int64_t));
        if (seg == NULL) return PyErr_NoMemory(), -1;
        t->log_seg = seg;
        t->log_cap = ncap;
    }
    if (t->log_ntok + n > t->log_tokcap) {
        int64_t ncap = t->log_tokcap ? 2 * t->log_tokcap : 1024;
        while (ncap < t->log_ntok + n) ncap *= 2;
        uint32_t *tok = PyMem_Realloc(t->log_tok, (size_t)ncap * sizeof(uint32_t));
        if (tok == NULL) return PyErr_NoMemory(), -1;
        t->log_tok = tok;
        t->log_tokcap = ncap;
    }
    return 0;
}

/* Prefetch what appending n tokens to s touches first, all of it cold since its last append: the
 * nodes its walked windows end at, the tail of its tokens. */
static inline void warm_seq(Tree *t, const Seq *s, Py_ssize_t n) {
    const int32_t *act = s->act + s->astart;
    for (int32_t i = s->lo ? s->lo - 1 : 0; i < s->na; i++) PREFETCH(&ND(act[i]));
    if (s->tok) PREFETCH(s->tok + s->len);
}

/* Step 2 of an extend: vals[0:n] (already in the sequence's Python list) into the tree, then the
 * log; returns how many went in (fewer than n only with an error set). No Python code runs. */
/* Before the first step of an extend of n tokens: room for them, the open prefix, the warm-up;
 * -1 with an error set if there is no room. */
static int extend_begin(Tree *t, int32_t sid, Py_ssize_t n) {
    Seq *s = &t->seqs[sid];
    if ((int64_t)s->len + n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "suffix tree: a sequence longer than 2**31 tokens");
        return -1;
    }
    if (t->log_on && log_reserve(t, n) < 0) return -1;
    if (s->len + n > s->cap) {
        int64_t ncap = s->cap ? s->cap : 16;
        while (ncap < s->len + n) ncap *= 2;
        if (ncap > INT32_MAX) ncap = INT32_MAX;
        int64_t *tok = PyMem_Realloc(s->tok, (size_t)ncap * sizeof(int64_t));
        if (tok == NULL) return PyErr_NoMemory(), -1;
        s->tok = tok;
        s->cap = (int32_t)ncap;
    }
    t->version++;
    if (t->deferred) return 0;
    int32_t *act = s->act + s->astart;
    warm_seq(t, s, n);
    /* Other sequences may have repeated some open leaves since (count 2 now): still a prefix. */
    while (s->lo && ND(act[s->lo - 1]).count != 1) s->lo--;
    return 0;
}

/* After the steps of an extend that started at `start` and appended vals[0:done]: its log segment. */
static void extend_end(Tree *t, int32_t sid, int32_t start, const int64_t *vals, Py_ssize_t done) {
    if (t->log_on && done > 0) {
        int64_t *seg = t->log_seg + 4 * t->log_n++;
        for (Py_ssize_t j = 0; j < done; j++) t->log_tok[t->log_ntok + j] = (uint32_t)vals[j];
        t->log_ntok += done;
        seg[0] = sid, seg[1] = start, seg[2] = done, seg[3] = t->log_ntok;
    }
}

/* Step 2 of an extend: vals[0:n] (already in the sequence's Python list) into the tree, then the
 * log; returns how many went in (fewer than n only with an error set). No Python code runs. */
static Py_ssize_t extend_tree(Tree *t, int32_t sid, const int64_t *vals, Py_ssize_t n) {
    Py_ssize_t done = 0;
    if (n <= 0) return 0;
    if (extend_begin(t, sid, n) < 0) return 0;
    int32_t start = t->seqs[sid].len;
    if (t->deferred) { /* the tokens only (room reserved by extend_begin): materialize() steps them */
        Seq *s = &t->seqs[sid];
        memcpy(s->tok + s->len, vals, (size_t)n * sizeof(int64_t));
        s->len += (int32_t)n;
        t->ntok += n;
        extend_end(t, sid, start, vals, n);
        return n;
    }
    for (; done < n; done++, t->ntok++) {
        if (reserve(t, t->max_depth + 1) < 0) break;
        step(t, sid, vals[done]);
    }
    extend_end(t, sid, start, vals, done);
    return done;
}

/* One extend of a batch (extend_batch). */
typedef struct {
    Tree *t;
    int32_t sid, start;
    const int64_t *vals;
    Py_ssize_t n, done;
} Job;

/* The first lookups of the next step of sequence sid (token tok), prefetched: the batch runs other
 * jobs' steps while they arrive. */
static inline void prep_step(Tree *t, int32_t sid, int64_t tok) {
    const Seq *s = &t->seqs[sid];
    const int32_t *act = s->act + s->astart;
    PREFETCH(&t->tab[hkey(0, tok) & t->mask]); /* the new window, at the root */
    for (int32_t i = s->lo; i < s->na; i++) {
        const CNode *nd = &ND(act[i]);
        if (nd->nkids > SCAN_MAX) PREFETCH(&t->tab[hkey(act[i], tok) & t->mask]);
        else if (nd->first != NONE) PREFETCH(&ND(nd->first));
    }
}

/* Runs jobs whose trees are all distinct, a token of each of up to BATCH_WINDOW of them in turn,
 * so that one job's cache misses overlap the others' work (a job starts when one ends, its first
 * lines prefetched): the same trees and logs as extend_tree on each job. 0, or -1 with an error set
 * (jobs[a].done says how far each got). */
#ifndef BATCH_WINDOW
#define BATCH_WINDOW 8
#endif
static int extend_batch(Job *jobs, Py_ssize_t k) {
    for (Py_ssize_t a = 0; a < k; a++) {
        jobs[a].done = 0;
        jobs[a].start = jobs[a].t->seqs[jobs[a].sid].len;
        if (jobs[a].n < 0) jobs[a].n = 0;
    }
    Job *win[BATCH_WINDOW];
    Py_ssize_t nwin = 0, next = 0;
    for (;;) {
        while (nwin < BATCH_WINDOW && next < k) { /* start the next jobs */
            Job *j = &jobs[next++];
            if (j->n == 0) continue;
            if (j->t->deferred) { /* no steps to interleave */
                j->done = extend_tree(j->t, j->sid, j->vals, j->n);
                if (j->done < j->n) {
                    for (Py_ssize_t b = next; b < k; b++) jobs[b].n = 0;
                    j->n = j->done;
                    return -1;
                }
                continue;
            }
            if (extend_begin(j->t, j->sid, j->n) < 0) {
                for (Py_ssize_t b = next - 1; b < k; b++) jobs[b].n = 0;
                return -1;
            }
            win[nwin++] = j; /* (its first lookups: by its first step, its lines warming meanwhile) */
        }
        if (nwin == 0) return 0;
        for (Py_ssize_t w = 0; w < nwin;) {
            Job *j = win[w];
            Tree *t = j->t;
            if (reserve(t, t->max_depth + 1) < 0) return -1;
            step(t, j->sid, j->vals[j->done]);
            t->ntok++;
            if (++j->done < j->n) {
                prep_step(t, j->sid, j->vals[j->done]);
                w++;
            } else {
                extend_end(t, j->sid, j->start, j->vals, j->done);
                j->n = j->done; /* (ended: its log segment is written) */
                win[w] = win[--nwin];
            }
        }
    }
}

/* Build a deferred tree: every logged segment's tokens stepped in log order, as the eager tree
 * stepped them when they came, so nodes, counts, edge references and sibling order are the same.
 * 0, or -1 with MemoryError: the tree is then reset to empty nodes and stays deferred, so that a
 * later read retries from the log. */
static int materialize(Tree *t) {
    if (!t->deferred) return 0;
    t->deferred = 0;
    for (int32_t i = 0; i < t->nseqs; i++) {
        Seq *s = &t->seqs[i];
        s->len = 0, s->astart = 0, s->na = 0, s->lo = 0; /* (the tokens stay: step writes them back) */
    }
    int64_t t0 = 0, ok = 1;
    for (int64_t g = 0; g < t->log_n && ok; g++) {
        const int64_t *seg = t->log_seg + 4 * g;
        Seq *s = &t->seqs[seg[0]];
        /* (extend_begin's: other sequences may have repeated some open leaves since) */
        while (s->lo && ND(s->act[s->astart + s->lo - 1]).count != 1) s->lo--;
        for (int64_t j = t0; j < seg[3]; j++) {
            if (reserve(t, t->max_depth + 1) < 0) {
                ok = 0;
                break;
            }
            step(t, (int32_t)seg[0], s->tok[s->len]);
        }
        t0 = seg[3];
    }
    if (ok) {
        t->version++;
        return 0;
    }
    /* out of memory: back to a deferred tree with only the root, every sequence at its full length */
    for (int32_t i = 0; i < t->nseqs; i++) t->seqs[i].len = 0, t->seqs[i].na = t->seqs[i].astart = t->seqs[i].lo = 0;
    for (int64_t g = 0; g < t->log_n; g++) t->seqs[t->log_seg[4 * g]].len += (int32_t)t->log_seg[4 * g + 2];
    PyMem_Free(t->tab);
    t->tab = NULL, t->mask = 0, t->tab_used = 0;
    t->num_nodes = 1, t->nodes_top = 1, t->free_head = NONE;
    ND(0).first = NONE, ND(0).nkids = 0, ND(0).count = 0;
    t->deferred = 1;
    return -1;
}

static PyObject *Tree_extend(Tree *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "extend(seq_id, tokens)");
        return NULL;
    }
    Py_ssize_t sid = PyLong_AsSsize_t(args[0]);
    if (sid == -1 && PyErr_Occurred()) return NULL;
    if (sid < 0 || sid >= t->nseqs) {
        PyErr_Format(PyExc_IndexError, "no sequence %zd", sid);
        return NULL;
    }
    /* 1. Every token as an int64 (Python code may run here: __index__, iterators), before the tree
     *    changes; a bad token stops the list there, and the tokens before it are still appended. */
    PyObject *fast = PySequence_Fast(args[1], "extend: tokens must be iterable");
    if (fast == NULL) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast), ok_n = m;
    int64_t stackbuf[64];
    int64_t *vals = m <= 64 ? stackbuf : PyMem_Malloc((size_t)m * sizeof(int64_t));
    if (vals == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    Seq *s = &t->seqs[sid];
    PyObject *list = s->list;
    Py_ssize_t list_len0 = PyList_GET_SIZE(list);
    for (Py_ssize_t j = 0; j < m; j++) {
        /* (items are re-read each time: `tokens` may be this very list, or change in __index__) */
        PyObject *as_int;
        if (j >= PySequence_Fast_GET_SIZE(fast)) {
            PyErr_SetString(PyExc_RuntimeError, "extend: tokens changed size");
            ok_n = j;
            break;
        }
        if (token_value(PySequence_Fast_GET_ITEM(fast, j), &vals[j], &as_int) < 0) {
            ok_n = j;
            break;
        }
        if (t->log_on && (vals[j] < 0 || vals[j] > (int64_t)UINT32_MAX)) { /* the log holds uint32 */
            Py_DECREF(as_int);
            PyErr_SetString(PyExc_ValueError, "a logged tree takes token ids in [0, 2**32)");
            ok_n = j;
            break;
        }
        int rc = t->lists_deferred ? 0 : PyList_Append(list, as_int);
        Py_DECREF(as_int);
        if (rc < 0) {
            ok_n = j;
            break;
        }
    }
    PyObject *exc_type = NULL, *exc_value = NULL, *exc_tb = NULL;
    if (ok_n < m) PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    /* 2. The tree (no Python code from here on). */
    Py_ssize_t done = extend_tree(t, (int32_t)sid, vals, ok_n);
    if (done < m && PyList_GET_SIZE(list) > list_len0 + done) {
        /* what was not appended leaves the Python list too */
        PyObject *e1, *e2, *e3;
        PyErr_Fetch(&e1, &e2, &e3);
        PyList_SetSlice(list, list_len0 + done, PyList_GET_SIZE(list), NULL);
        PyErr_Restore(e1, e2, e3);
    }
    if (vals != stackbuf) PyMem_Free(vals);
    Py_DECREF(fast);
    if (exc_type != NULL) {
        if (PyErr_Occurred()) { /* a later error (memory) wins */
            Py_XDECREF(exc_type);
            Py_XDECREF(exc_value);
            Py_XDECREF(exc_tb);
        } else {
            PyErr_Restore(exc_type, exc_value, exc_tb);
        }
        return NULL;
    }
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* append_at(seq_id, prev, buf, off, n, max_tokens) -> int: the draft server's in-order append.
 * If sequence seq_id holds exactly prev tokens, n > 0 and the tree stays within max_tokens, append
 * tokens [off, off + n) of buf (packed little-endian uint32) and return the sequence's new length;
 * otherwise change nothing and return -1 (-2: over max_tokens), for the caller's general path. */
static PyObject *Tree_append_at(Tree *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "append_at(seq_id, prev, buf, off, n, max_tokens)");
        return NULL;
    }
    Py_ssize_t sid = PyLong_AsSsize_t(args[0]), off = PyLong_AsSsize_t(args[3]), n = PyLong_AsSsize_t(args[4]);
    long long prev = PyLong_AsLongLong(args[1]), max_tokens = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (sid < 0 || sid >= t->nseqs) {
        PyErr_Format(PyExc_IndexError, "no sequence %zd", sid);
        return NULL;
    }
    Seq *s = &t->seqs[sid];
    if (n <= 0 || prev != s->len) return PyLong_FromLong(-1);
    if (t->ntok + n > max_tokens) return PyLong_FromLong(-2);
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (off < 0 || (off + n) * 4 > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "append_at: [off, off + n) outside the buffer");
        return NULL;
    }
    int64_t stackbuf[64];
    int64_t *vals = n <= 64 ? stackbuf : PyMem_Malloc((size_t)n * sizeof(int64_t));
    if (vals == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    const unsigned char *p = (const unsigned char *)view.buf + 4 * off;
    Py_ssize_t list_len0 = PyList_GET_SIZE(s->list), ok_n = n;
    for (Py_ssize_t j = 0; j < n; j++, p += 4) {
        vals[j] = (int64_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        if (t->lists_deferred) continue;
        PyObject *v = PyLong_FromLongLong(vals[j]);
        if (v == NULL || PyList_Append(s->list, v) < 0) {
            Py_XDECREF(v);
            ok_n = 0;
            break;
        }
        Py_DECREF(v);
    }
    PyBuffer_Release(&view);
    Py_ssize_t done = ok_n ? extend_tree(t, (int32_t)sid, vals, n) : 0;
    if (vals != stackbuf) PyMem_Free(vals);
    if (done < n) { /* an error: what did not go in leaves the Python list too */
        PyObject *e1, *e2, *e3;
        PyErr_Fetch(&e1, &e2, &e3);
        PyList_SetSlice(s->list, list_len0 + done, PyList_GET_SIZE(s->list), NULL);
        PyErr_Restore(e1, e2, e3);
        return NULL;
    }
    return PyLong_FromLong(s->len);
}

static PyObject *Tree_add_sequence(Tree *t, PyObject *Py_UNUSED(ignored)) {
    if (t->nseqs == t->seqs_cap) {
        int32_t ncap = t->seqs_cap ? t->seqs_cap * 2 : 8;
        Seq *seqs = PyMem_Realloc(t->seqs, (size_t)ncap * sizeof(Seq));
        if (seqs == NULL) return PyErr_NoMemory();
        t->seqs = seqs;
        t->seqs_cap = ncap;
    }
    Seq *s = &t->seqs[t->nseqs];
    memset(s, 0, sizeof(Seq));
    if ((s->act = PyMem_Malloc((size_t)2 * (t->max_depth + 1) * sizeof(int32_t))) == NULL) return PyErr_NoMemory();
    if ((s->list = PyList_New(0)) == NULL || PyList_Append(t->pyseqs, s->list) < 0) {
        PyMem_Free(s->act);
        Py_XDECREF(s->list);
        return NULL;
    }
    return PyLong_FromLong(t->nseqs++);
}

/* ---- queries ---------------------------------------------------------------------------------- */

/* Where pattern[0:m] ends: node and offset into its edge; 0 if absent. */
static int locate(Tree *t, const int64_t *pat, Py_ssize_t m, int32_t *node_out, int32_t *off_out) {
    int32_t node = 0, off = 0;
    Py_ssize_t i = 0;
    while (i < m) {
        if (off == elen(t, &ND(node))) {
            int32_t c = child_find(t, node, pat[i]);
            if (c == NONE) return 0;
            node = c;
            off = 0;
        }
        const CNode *nd = &ND(node);
        Py_ssize_t take = elen(t, nd) - off;
        if (take > m - i) take = m - i;
        const int64_t *edge = t->seqs[nd->ref_seq].tok + nd->ref_idx + off;
        for (Py_ssize_t j = 0; j < take; j++)
            if (edge[j] != pat[i + j]) return 0;
        off += (int32_t)take;
        i += take;
    }
    *node_out = node;
    *off_out = off;
    return 1;
}

/* The last `want` items of a sequence as int64s into buf (which holds want); -1 on error. */
static int tail_values(PyObject *seq, Py_ssize_t want, int64_t *buf, Py_ssize_t *len_out) {
    PyObject *fast = PySequence_Fast(seq, "context must be a sequence of token ids");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t take = n < want ? n : want;
    for (Py_ssize_t j = 0; j < take; j++) {
        PyObject *as_int;
        if (PySequence_Fast_GET_SIZE(fast) != n) {
            PyErr_SetString(PyExc_RuntimeError, "context changed size");
            Py_DECREF(fast);
            return -1;
        }
        if (token_value(PySequence_Fast_GET_ITEM(fast, n - take + j), &buf[j], &as_int) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        Py_DECREF(as_int);
    }
    Py_DECREF(fast);
    *len_out = n;
    return 0;
}

static PyObject *Tree_count(Tree *t, PyObject *pattern) {
    if (materialize(t) < 0) return NULL;
    PyObject *fast = PySequence_Fast(pattern, "pattern must be a sequence of token ids");
    if (fast == NULL) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    Py_DECREF(fast);
    int64_t *buf = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(int64_t));
    if (buf == NULL) return PyErr_NoMemory();
    Py_ssize_t n;
    PyObject *res = NULL;
    if (tail_values(pattern, m, buf, &n) == 0) {
        int32_t node, off;
        res = PyLong_FromLongLong(locate(t, buf, m, &node, &off) ? ND(node).count : 0);
    }
    PyMem_Free(buf);
    return res;
}

/* ---- drafting (drafting.py) ------------------------------------------------------------------- */

static int get_ssize(PyObject *o, PyObject *name, Py_ssize_t *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* DraftPath(tokens, probs) from the first n of toks/probs */
static PyObject *make_path(const int64_t *toks, const double *probs, Py_ssize_t n) {
    PyObject *tt = PyTuple_New(n), *pt = PyTuple_New(n);
    if (tt == NULL || pt == NULL) goto fail;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *a = PyLong_FromLongLong(toks[j]), *b = PyFloat_FromDouble(probs[j]);
        if (a == NULL || b == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            goto fail;
        }
        PyTuple_SET_ITEM(tt, j, a);
        PyTuple_SET_ITEM(pt, j, b);
    }
    /* a frozen dataclass: object.__new__ and object.__setattr__, as its own __init__ does */
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL) goto fail;
    PyObject *p = PyBaseObject_Type.tp_new((PyTypeObject *)draft_path_type, empty, NULL);
    Py_DECREF(empty);
    if (p == NULL) goto fail;
    if (PyObject_GenericSetAttr(p, s_tokens, tt) < 0 || PyObject_GenericSetAttr(p, s_probs, pt) < 0) {
        Py_DECREF(p);
        goto fail;
    }
    Py_DECREF(tt);
    Py_DECREF(pt);
    return p;
fail:
    Py_XDECREF(tt);
    Py_XDECREF(pt);
    return NULL;
}

/* The most frequent child of `node` (smallest token on ties). */
static inline int32_t best_child(Tree *t, int32_t node) {
    int32_t best = NONE;
    for (int32_t c = ND(node).first; c != NONE; c = ND(c).next) {
        if (best == NONE || ND(c).count > ND(best).count || (ND(c).count == ND(best).count && ND(c).tok < ND(best).tok))
            best = c;
    }
    return best;
}

/* drafting._linear: appends the path to `out` (nothing if empty) */
static int draft_linear(Tree *t, int32_t node, int32_t off, Py_ssize_t budget, double floor, PyObject *out) {
    int64_t tbuf[256];
    double pbuf[256];
    int64_t *toks = tbuf;
    double *probs = pbuf;
    if (budget > 256) {
        toks = PyMem_Malloc((size_t)budget * sizeof(int64_t));
        probs = PyMem_Malloc((size_t)budget * sizeof(double));
        if (toks == NULL || probs == NULL) {
            PyMem_Free(toks);
            PyMem_Free(probs);
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_ssize_t n = 0;
    double prob = 1.0;
    while (n < budget) {
        const CNode *nd = &ND(node);
        int64_t tok;
        if (off < elen(t, nd)) {
            tok = t->seqs[nd->ref_seq].tok[nd->ref_idx + off];
            off++;
        } else {
            if (nd->first == NONE) break;
            int32_t best = best_child(t, node);
            double p = prob * (double)ND(best).count / (double)nd->count;
            if (p < floor) break;
            prob = p;
            tok = ND(best).tok;
            node = best;
            off = 1;
        }
        toks[n] = tok;
        probs[n] = prob;
        n++;
    }
    int rc = 0;
    if (n) {
        PyObject *p = make_path(toks, probs, n);
        if (p == NULL || PyList_Append(out, p) < 0) rc = -1;
        Py_XDECREF(p);
    }
    if (toks != tbuf) {
        PyMem_Free(toks);
        PyMem_Free(probs);
    }
    return rc;
}

/* drafting._multi_path. A beam: its probability, node, offset and its tokens/probs so far (in
 * flat arrays, `budget` per beam). */
typedef struct {
    double prob;
    int32_t node, off;
    Py_ssize_t idx; /* row in the history arrays */
} Beam;

typedef struct {
    int64_t *toks;
    double *probs;
    Py_ssize_t len; /* tokens per history row at this step */
} Hist;

static Py_ssize_t g_cmp_len;
static const int64_t *g_cmp_toks;
static Py_ssize_t g_cmp_stride;

/* grown.sort(key=lambda b: (-b.prob, b.tokens)) (all histories have the same length) */
static int beam_cmp(const void *a, const void *b) {
    const Beam *x = a, *y = b;
    if (x->prob > y->prob) return -1;
    if (x->prob < y->prob) return 1;
    const int64_t *tx = g_cmp_toks + x->idx * g_cmp_stride, *ty = g_cmp_toks + y->idx * g_cmp_stride;
    for (Py_ssize_t j = 0; j < g_cmp_len; j++) {
        if (tx[j] < ty[j]) return -1;
        if (tx[j] > ty[j]) return 1;
    }
    return 0;
}

typedef struct {
    double score;
    Py_ssize_t len;
    int64_t *toks;
    double *probs;
} Cand;

/* paths.sort(key=lambda d: (-d.score, d.tokens)); score = sum(probs) as Python 3.11's sum() adds
 * floats (left to right, in doubles) */
static int cand_cmp(const void *a, const void *b) {
    const Cand *x = a, *y = b;
    if (x->score > y->score) return -1;
    if (x->score < y->score) return 1;
    Py_ssize_t m = x->len < y->len ? x->len : y->len;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (x->toks[j] < y->toks[j]) return -1;
        if (x->toks[j] > y->toks[j]) return 1;
    }
    return (x->len > y->len) - (x->len < y->len);
}

/* Appends the ranked paths to `out`; all of them (for the caller to rank) when `rank` is 0. */
static int draft_multi(Tree *t, int32_t node0, int32_t off0, Py_ssize_t budget, double floor, Py_ssize_t k,
                       int rank, PyObject *out) {
    int rc = -1;
    /* storage: beams (<= k) and grown (<= sum of children + k); histories copied per entry */
    Py_ssize_t beams_cap = 1, grown_cap = 0, grown_n = 0, beams_n = 1;
    Beam *beams = PyMem_Malloc(sizeof(Beam)), *grown = NULL;
    Hist bh = {NULL, NULL, 0}, gh = {NULL, NULL, 0};
    Py_ssize_t stride = budget ? budget : 1;
    Cand *done = NULL;
    Py_ssize_t done_n = 0, done_cap = 0;
    bh.toks = PyMem_Malloc((size_t)stride * sizeof(int64_t));
    bh.probs = PyMem_Malloc((size_t)stride * sizeof(double));
    if (beams == NULL || bh.toks == NULL || bh.probs == NULL) {
        PyErr_NoMemory();
        goto cleanup;
    }
    beams[0].prob = 1.0;
    beams[0].node = node0;
    beams[0].off = off0;
    beams[0].idx = 0;
    bh.len = 0;
    (void)beams_cap;
#define PUSH_DONE(TOKS, PROBS, LEN)                                                          \
    do {                                                                                     \
        if (done_n == done_cap) {                                                            \
            Py_ssize_t nc = done_cap ? done_cap * 2 : 16;                                   \
            Cand *nd_ = PyMem_Realloc(done, (size_t)nc * sizeof(Cand));                      \
            if (nd_ == NULL) {                                                               \
                PyErr_NoMemory();                                                            \
                goto cleanup;                                                                \
            }                                                                                \
            done = nd_;                                                                      \
            done_cap = nc;                                                                   \
        }                                                                                    \
        Cand *c_ = &done[done_n];                                                            \
        c_->len = (LEN);                                                                     \
        c_->toks = PyMem_Malloc((size_t)(c_->len ? c_->len : 1) * sizeof(int64_t));          \
        c_->probs = PyMem_Malloc((size_t)(c_->len ? c_->len : 1) * sizeof(double));          \
        if (c_->toks == NULL || c_->probs == NULL) {                                         \
            PyMem_Free(c_->toks);                                                            \
            PyMem_Free(c_->probs);                                                           \
            PyErr_NoMemory();                                                                \
            goto cleanup;                                                                    \
        }                                                                                    \
        memcpy(c_->toks, (TOKS), (size_t)c_->len * sizeof(int64_t));                         \
        memcpy(c_->probs, (PROBS), (size_t)c_->len * sizeof(double));                        \
        done_n++;                                                                            \
    } while (0)

    for (Py_ssize_t step_i = 0; step_i < budget; step_i++) {
        /* size grown: each beam yields 1 (inside an edge) or up to its number of children */
        Py_ssize_t need = 0;
        for (Py_ssize_t b = 0; b < beams_n; b++) {
            const CNode *nd = &ND(beams[b].node);
            need += beams[b].off < elen(t, nd) ? 1 : nd->nkids;
        }
        if (need > grown_cap) {
            Py_ssize_t nc = need;
            Beam *g = PyMem_Realloc(grown, (size_t)nc * sizeof(Beam));
            if (g == NULL) {
                PyErr_NoMemory();
                goto cleanup;
            }
            grown = g;
            int64_t *gt = PyMem_Realloc(gh.toks, (size_t)nc * stride * sizeof(int64_t));
            if (gt == NULL) {
                PyErr_NoMemory();
                goto cleanup;
            }
            gh.toks = gt;
            double *gp = PyMem_Realloc(gh.probs, (size_t)nc * stride * sizeof(double));
            if (gp == NULL) {
                PyErr_NoMemory();
                goto cleanup;
            }
            gh.probs = gp;
            grown_cap = nc;
        }
        grown_n = 0;
        Py_ssize_t L = bh.len;
        for (Py_ssize_t b = 0; b < beams_n; b++) {
            const Beam *bm = &beams[b];
            const CNode *nd = &ND(bm->node);
            const int64_t *src_t = bh.toks + bm->idx * stride;
            const double *src_p = bh.probs + bm->idx * stride;
            if (bm->off < elen(t, nd)) {
                Beam *g = &grown[grown_n];
                g->prob = bm->prob;
                g->node = bm->node;
                g->off = bm->off + 1;
                g->idx = grown_n;
                memcpy(gh.toks + grown_n * stride, src_t, (size_t)L * sizeof(int64_t));
                memcpy(gh.probs + grown_n * stride, src_p, (size_t)L * sizeof(double));
                gh.toks[grown_n * stride + L] = t->seqs[nd->ref_seq].tok[nd->ref_idx + bm->off];
                gh.probs[grown_n * stride + L] = bm->prob;
                grown_n++;
                continue;
            }
            int extended = 0;
            for (int32_t c = nd->first; c != NONE; c = ND(c).next) {
                double p = bm->prob * (double)ND(c).count / (double)nd->count;
                if (p >= floor) {
                    Beam *g = &grown[grown_n];
                    g->prob = p;
                    g->node = c;
                    g->off = 1;
                    g->idx = grown_n;
                    memcpy(gh.toks + grown_n * stride, src_t, (size_t)L * sizeof(int64_t));
                    memcpy(gh.probs + grown_n * stride, src_p, (size_t)L * sizeof(double));
                    gh.toks[grown_n * stride + L] = ND(c).tok;
                    gh.probs[grown_n * stride + L] = p;
                    grown_n++;
                    extended = 1;
                }
            }
            if (!extended) PUSH_DONE(src_t, src_p, L);
        }
        if (grown_n == 0) {
            beams_n = 0;
            break;
        }
        g_cmp_len = L + 1;
        g_cmp_toks = gh.toks;
        g_cmp_stride = stride;
        qsort(grown, (size_t)grown_n, sizeof(Beam), beam_cmp);
        /* beams = grown[:k]: swap the roles of the two storages */
        Py_ssize_t keep = grown_n < k ? grown_n : k;
        Beam *tb = beams;
        beams = grown;
        grown = tb;
        Py_ssize_t tcap = grown_cap;
        grown_cap = beams_cap;
        beams_cap = tcap;
        Hist th = bh;
        bh = gh;
        gh = th;
        bh.len = L + 1;
        beams_n = keep;
    }
    for (Py_ssize_t b = 0; b < beams_n; b++)
        PUSH_DONE(bh.toks + beams[b].idx * stride, bh.probs + beams[b].idx * stride, bh.len);
#undef PUSH_DONE
    {
        /* drop the empty ones, rank, keep k */
        Py_ssize_t w = 0;
        for (Py_ssize_t j = 0; j < done_n; j++) {
            if (done[j].len == 0) {
                PyMem_Free(done[j].toks);
                PyMem_Free(done[j].probs);
                continue;
            }
            double s = 0.0;
            for (Py_ssize_t q = 0; q < done[j].len; q++) s += done[j].probs[q];
            done[j].score = s;
            done[w++] = done[j];
        }
        done_n = w;
        Py_ssize_t emit = done_n;
        if (rank) {
            qsort(done, (size_t)done_n, sizeof(Cand), cand_cmp);
            if (emit > k) emit = k;
        }
        for (Py_ssize_t j = 0; j < emit; j++) {
            PyObject *p = make_path(done[j].toks, done[j].probs, done[j].len);
            if (p == NULL || PyList_Append(out, p) < 0) {
                Py_XDECREF(p);
                goto cleanup;
            }
            Py_DECREF(p);
        }
    }
    rc = 0;
cleanup:
    for (Py_ssize_t j = 0; j < done_n; j++) {
        PyMem_Free(done[j].toks);
        PyMem_Free(done[j].probs);
    }
    PyMem_Free(done);
    PyMem_Free(beams);
    PyMem_Free(grown);
    PyMem_Free(bh.toks);
    PyMem_Free(bh.probs);
    PyMem_Free(gh.toks);
    PyMem_Free(gh.probs);
    return rc;
}

/* draft(context, params[, rank=True]) -> (paths, match_len): drafting.draft on this tree. With
 * rank false, top_k > 1 returns every candidate path unranked (the caller ranks them). */
static PyObject *Tree_draft(Tree *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "draft(context, params[, rank])");
        return NULL;
    }
    if (draft_path_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_suffix_core.bind(DraftPath) first");
        return NULL;
    }
    int rank = 1;
    if (nargs == 3 && (rank = PyObject_IsTrue(args[2])) < 0) return NULL;
    if (materialize(t) < 0) return NULL;
    PyObject *params = args[1];
    Py_ssize_t max_spec, lmin, lmax, topk;
    if (get_ssize(params, s_max_spec, &max_spec) < 0 || get_ssize(params, s_lmin, &lmin) < 0 ||
        get_ssize(params, s_lmax, &lmax) < 0 || get_ssize(params, s_topk, &topk) < 0)
        return NULL;
    PyObject *fl = PyObject_GetAttr(params, s_floor);
    if (fl == NULL) return NULL;
    double floor = PyFloat_AsDouble(fl);
    Py_DECREF(fl);
    if (floor == -1.0 && PyErr_Occurred()) return NULL;
    PyObject *paths = PyList_New(0);
    if (paths == NULL) return NULL;
    Py_ssize_t match_len = 0;
    if (max_spec > 0) {
        Py_ssize_t want = lmax < t->max_depth - 1 ? lmax : t->max_depth - 1;
        if (want < 0) want = 0;
        int64_t cbuf[128];
        int64_t *ctx = want <= 128 ? cbuf : PyMem_Malloc((size_t)want * sizeof(int64_t));
        if (ctx == NULL) {
            Py_DECREF(paths);
            return PyErr_NoMemory();
        }
        Py_ssize_t n;
        if (tail_values(args[0], want, ctx, &n) < 0) {
            if (ctx != cbuf) PyMem_Free(ctx);
            Py_DECREF(paths);
            return NULL;
        }
        Py_ssize_t have = n < want ? n : want; /* ctx[0:have] is the context's tail */
        Py_ssize_t hi = have, lo = lmin;
        int32_t bnode = NONE, boff = 0;
        while (lo <= hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            int32_t node, off;
            if (locate(t, ctx + have - mid, mid, &node, &off) && (off < elen(t, &ND(node)) || ND(node).first != NONE)) {
                bnode = node;
                boff = off;
                match_len = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        if (ctx != cbuf) PyMem_Free(ctx);
        if (bnode != NONE) {
            Py_ssize_t budget = max_spec < t->max_depth - match_len ? max_spec : t->max_depth - match_len;
            int rc = topk == 1 ? draft_linear(t, bnode, boff, budget, floor, paths)
                               : draft_multi(t, bnode, boff, budget, floor, topk, rank, paths);
            if (rc < 0) {
                Py_DECREF(paths);
                return NULL;
            }
        }
    }
    PyObject *ml = PyLong_FromSsize_t(match_len);
    if (ml == NULL) {
        Py_DECREF(paths);
        return NULL;
    }
    PyObject *res = PyTuple_Pack(2, paths, ml);
    Py_DECREF(paths);
    Py_DECREF(ml);
    return res;
}

/* ---- introspection ---------------------------------------------------------------------------- */

/* Every node, parents first: (parent's position in the list or -1, count, length, ref_seq,
 * ref_idx, growing). SuffixTree builds its Python view of a compiled tree from it. */
static PyObject *Tree_dump(Tree *t, PyObject *Py_UNUSED(ignored)) {
    if (materialize(t) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    int32_t *queue = PyMem_Malloc((size_t)(t->num_nodes + 1) * sizeof(int32_t));
    int32_t *pos_parent = PyMem_Malloc((size_t)(t->num_nodes + 1) * sizeof(int32_t));
    if (queue == NULL || pos_parent == NULL) {
        PyMem_Free(queue);
        PyMem_Free(pos_parent);
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    Py_ssize_t head = 0, tail = 0;
    queue[tail] = 0;
    pos_parent[tail++] = -1;
    while (head < tail) {
        int32_t id = queue[head];
        const CNode *nd = &ND(id);
        PyObject *row = Py_BuildValue("(iLiiii)", pos_parent[head], (long long)nd->count, elen(t, nd), nd->ref_seq,
                                      nd->ref_idx, is_open(t, nd));
        if (row == NULL || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            Py_DECREF(out);
            out = NULL;
            break;
        }
        Py_DECREF(row);
        for (int32_t c = nd->first; c != NONE; c = ND(c).next) {
            if (tail > t->num_nodes) {
                PyErr_SetString(PyExc_RuntimeError, "suffix tree: node count mismatch");
                Py_DECREF(out);
                out = NULL;
                goto done;
            }
            queue[tail] = c;
            pos_parent[tail++] = (int32_t)head;
        }
        head++;
    }
done:
    PyMem_Free(queue);
    PyMem_Free(pos_parent);
    return out;
}

/* A lazy tree's Python lists, filled when first asked for (then kept by every append). */
static int fill_lists(Tree *t) {
    if (!t->lists_deferred) return 0;
    for (int32_t i = 0; i < t->nseqs; i++) {
        Seq *s = &t->seqs[i];
        for (Py_ssize_t j = PyList_GET_SIZE(s->list); j < s->len; j++) {
            PyObject *v = PyLong_FromLongLong(s->tok[j]);
            if (v == NULL || PyList_Append(s->list, v) < 0) {
                Py_XDECREF(v);
                return -1; /* (still deferred: a later read goes on from where this stopped) */
            }
            Py_DECREF(v);
        }
    }
    t->lists_deferred = 0;
    return 0;
}

static PyObject *Tree_get_seqs(Tree *t, void *closure) {
    if (fill_lists(t) < 0) return NULL;
    return Py_NewRef(t->pyseqs);
}

/* seq_len(i): sequence i's length; seq_tokens(i, start, stop): its tokens [start, stop) as a list
 * (GroupState's reads: they leave a lazy tree's lists deferred). */
static int seq_arg(Tree *t, PyObject *o, Py_ssize_t *out) {
    Py_ssize_t i = PyLong_AsSsize_t(o);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0 || i >= t->nseqs) {
        PyErr_Format(PyExc_IndexError, "no sequence %zd", i);
        return -1;
    }
    *out = i;
    return 0;
}

static PyObject *Tree_seq_len(Tree *t, PyObject *arg) {
    Py_ssize_t i;
    if (seq_arg(t, arg, &i) < 0) return NULL;
    return PyLong_FromLong(t->seqs[i].len);
}

static PyObject *Tree_seq_tokens(Tree *t, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t i;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "seq_tokens(seq_id, start, stop)");
        return NULL;
    }
    if (seq_arg(t, args[0], &i) < 0) return NULL;
    Py_ssize_t a = PyLong_AsSsize_t(args[1]), b = PyLong_AsSsize_t(args[2]), len = t->seqs[i].len;
    if (PyErr_Occurred()) return NULL;
    a = a < 0 ? 0 : (a > len ? len : a), b = b < a ? a : (b > len ? len : b); /* (slice bounds) */
    PyObject *out = PyList_New(b - a);
    if (out == NULL) return NULL;
    for (Py_ssize_t j = a; j < b; j++) {
        PyObject *v = PyLong_FromLongLong(t->seqs[i].tok[j]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j - a, v);
    }
    return out;
}
static PyObject *Tree_get_num_nodes(Tree *t, void *closure) {
    if (materialize(t) < 0) return NULL;
    return PyLong_FromLongLong(t->num_nodes);
}
static PyObject *Tree_get_deferred(Tree *t, void *closure) { return PyBool_FromLong(t->deferred); }
static PyObject *Tree_get_ttl(Tree *t, void *closure) { return PyFloat_FromDouble(t->ttl); }
static PyObject *Tree_get_expires_at(Tree *t, void *closure) { return PyFloat_FromDouble(t->expires_at); }
static int set_double(double *out, PyObject *v) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete a lease field");
        return -1;
    }
    double d = PyFloat_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    *out = d;
    return 0;
}
static int Tree_set_ttl(Tree *t, PyObject *v, void *closure) { return set_double(&t->ttl, v); }
static int Tree_set_expires_at(Tree *t, PyObject *v, void *closure) { return set_double(&t->expires_at, v); }
static PyObject *Tree_materialize(Tree *t, PyObject *Py_UNUSED(ignored)) {
    if (materialize(t) < 0) return NULL;
    Py_RETURN_NONE;
}
static PyObject *Tree_get_num_tokens(Tree *t, void *closure) { return PyLong_FromLongLong(t->ntok); }
static PyObject *Tree_get_max_depth(Tree *t, void *closure) { return PyLong_FromLong(t->max_depth); }
static PyObject *Tree_get_version(Tree *t, void *closure) { return PyLong_FromUnsignedLongLong(t->version); }
static PyObject *Tree_get_log_size(Tree *t, void *closure) { return PyLong_FromLongLong(t->log_n); }

/* ---- the draft server's fetches --------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}

/* Log segments [cur, end) of t as uint32 triples at *sp and their tokens at *tp (both little-endian);
 * advances both. Shared by log_fetch and sync_packed's fetches. */
static void put_log(const Tree *t, int64_t cur, int64_t end, unsigned char **sp, unsigned char **tp) {
    for (int64_t g = cur; g < end; g++, *sp += 12) {
        const int64_t *seg = t->log_seg + 4 * g;
        put_u32(*sp, (uint32_t)seg[0]), put_u32(*sp + 4, (uint32_t)seg[1]), put_u32(*sp + 8, (uint32_t)seg[2]);
    }
    int64_t t0 = cur ? t->log_seg[4 * (cur - 1) + 3] : 0, t1 = t->log_seg[4 * (end - 1) + 3];
#if PY_LITTLE_ENDIAN
    memcpy(*tp, t->log_tok + t0, (size_t)(t1 - t0) * 4);
    *tp += (t1 - t0) * 4;
#else
    for (int64_t j = t0; j < t1; j++, *tp += 4) put_u32(*tp, t->log_tok[j]);
#endif
}

static PyTypeObject TreeType;

/* log_fetch(trees, cursors, known, max_tokens) -> (next, segments, new_requests, more, segs, toks):
 * for each i, what a replica of logged tree trees[i] (None: an unknown group, answered empty) at
 * log offset cursors[i] lacks, at most max_tokens tokens over all (each fetch gets at least one
 * segment while the budget lasts, as GroupStore.fetch), and how many sequences it has beyond the
 * known[i] its caller knows. next / segments / new_requests are lists (one int per fetch), more
 * the indices of fetches cut short, segs the segments as little-endian uint32 triples (sequence,
 * start, length), toks their tokens. Every cursor and count is checked before anything is built:
 * ValueError names the first one outside its tree. */
static PyObject *log_fetch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "log_fetch(trees, cursors, known, max_tokens)");
        return NULL;
    }
    long long budget = PyLong_AsLongLong(args[3]);
    if (budget == -1 && PyErr_Occurred()) return NULL;
    PyObject *ft = PySequence_Fast(args[0], "trees must be a sequence"), *fc = NULL, *fk = NULL, *out = NULL;
    PyObject *next = NULL, *nseg = NULL, *nnew = NULL, *more = NULL, *segs = NULL, *toks = NULL;
    int64_t *cur = NULL, *end = NULL;
    if (ft == NULL || (fc = PySequence_Fast(args[1], "cursors must be a sequence")) == NULL ||
        (fk = PySequence_Fast(args[2], "known must be a sequence")) == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ft);
    if (PySequence_Fast_GET_SIZE(fc) != n || PySequence_Fast_GET_SIZE(fk) != n) {
        PyErr_SetString(PyExc_ValueError, "trees, cursors and known differ in length");
        goto done;
    }
    cur = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    end = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (cur == NULL || end == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* 1. check everything */
        PyObject *o = PySequence_Fast_GET_ITEM(ft, i);
        long long c = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fc, i));
        long long k = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fk, i));
        if (PyErr_Occurred()) goto done;
        cur[i] = c;
        if (o == Py_None) continue;
        if (!PyObject_TypeCheck(o, &TreeType) || !((Tree *)o)->log_on) {
            PyErr_SetString(PyExc_TypeError, "log_fetch: trees must be logged Trees or None");
            goto done;
        }
        Tree *t = (Tree *)o;
        if (c < 0 || c > t->log_n || k < 0 || k > t->nseqs) {
            PyErr_Format(PyExc_ValueError, "fetch %zd: cursor %lld or known %lld outside the tree (log 0..%lld, %d sequences)",
                         i, c, k, (long long)t->log_n, t->nseqs);
            goto done;
        }
    }
    int64_t total_seg = 0, total_tok = 0, left = budget;
    if ((more = PyList_New(0)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) { /* 2. where each fetch ends */
        PyObject *o = PySequence_Fast_GET_ITEM(ft, i);
        end[i] = cur[i];
        if (o == Py_None || cur[i] == ((Tree *)o)->log_n) continue;
        Tree *t = (Tree *)o;
        int64_t t0 = cur[i] ? t->log_seg[4 * (cur[i] - 1) + 3] : 0, e = t->log_n;
        if (t->log_ntok - t0 > left) { /* the first segment past the budget, but at least one */
            int64_t lo = cur[i] + 1, hi = t->log_n;
            while (lo < hi) {
                int64_t mid = (lo + hi) / 2;
                if (t->log_seg[4 * mid + 3] - t0 <= left) lo = mid + 1; else hi = mid;
            }
            e = lo;
            PyObject *idx = PyLong_FromSsize_t(i);
            if (idx == NULL || PyList_Append(more, idx) < 0) {
                Py_XDECREF(idx);
                goto done;
            }
            Py_DECREF(idx);
        }
        end[i] = e;
        int64_t got = t->log_seg[4 * (e - 1) + 3] - t0;
        total_seg += e - cur[i];
        total_tok += got;
        left = left - got > 1 ? left - got : 1;
    }
    if ((next = PyList_New(n)) == NULL || (nseg = PyList_New(n)) == NULL || (nnew = PyList_New(n)) == NULL ||
        (segs = PyBytes_FromStringAndSize(NULL, 12 * total_seg)) == NULL ||
        (toks = PyBytes_FromStringAndSize(NULL, 4 * total_tok)) == NULL)
        goto done;
    unsigned char *sp = (unsigned char *)PyBytes_AS_STRING(segs), *tp = (unsigned char *)PyBytes_AS_STRING(toks);
    for (Py_ssize_t i = 0; i < n; i++) { /* 3. the answer */
        PyObject *o = PySequence_Fast_GET_ITEM(ft, i);
        long long k = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fk, i));
        Tree *t = o == Py_None ? NULL : (Tree *)o;
        PyList_SET_ITEM(next, i, PyLong_FromLongLong(end[i]));
        PyList_SET_ITEM(nseg, i, PyLong_FromLongLong(end[i] - cur[i]));
        PyList_SET_ITEM(nnew, i, PyLong_FromLongLong(t ? t->nseqs - k : 0));
        if (t == NULL || end[i] == cur[i]) continue;
        put_log(t, cur[i], end[i], &sp, &tp);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyList_GET_ITEM(next, i) || !PyList_GET_ITEM(nseg, i) || !PyList_GET_ITEM(nnew, i)) goto done;
    out = PyTuple_Pack(6, next, nseg, nnew, more, segs, toks);
done:
    Py_XDECREF(ft);
    Py_XDECREF(fc);
    Py_XDECREF(fk);
    Py_XDECREF(next);
    Py_XDECREF(nseg);
    Py_XDECREF(nnew);
    Py_XDECREF(more);
    Py_XDECREF(segs);
    Py_XDECREF(toks);
    PyMem_Free(cur);
    PyMem_Free(end);
    return out;
}

/* ---- the draft server's packed Sync message, whole ------------------------------------------- */

/* sync_packed(raw, states, groups, ended, now, limits) -> bytes | None: GroupStore.sync for one
 * serialized SyncRequest, answered as a serialized SyncResponse, with no Python step per group,
 * append or token. `states` maps the live groups' ids to their GroupState (GroupStore._groups, the
 * truth), `groups` the same ids to (state, tree core, request_index, pending, request_ids)
 * (GroupStore._fast), `ended` holds the ids of ended groups. The fetches come first,
 * then the appends in order, exactly as GroupStore.sync: an append that does not simply continue
 * its sequence goes to `state.apply` (Python), and then the message's appends run in order one by
 * one; otherwise they run as one interleaved batch (extend_batch: same trees, same logs). None,
 * with nothing changed, for anything GroupStore.sync would refuse or that this parser does not
 * take (malformed, over a limit, odd encodings): the caller then runs GroupStore.sync, which says
 * why. */

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
} Str;

typedef struct {
    uint64_t *v;
    Py_ssize_t n;
} U64s;

typedef struct {
    Str *gids, *rids;
    Py_ssize_t ng, nr;
    U64s f[10]; /* repeated scalar fields 3, 4, 5, 7, 8, 9 by number */
    const unsigned char *tok;
    Py_ssize_t ntokb;
    int64_t max_tokens;
} Req;

static int rd_varint(const unsigned char **pp, const unsigned char *e, uint64_t *v) {
    uint64_t x = 0;
    const unsigned char *p = *pp;
    for (int sh = 0; p < e && sh < 64; sh += 7) {
        unsigned char b = *p++;
        x |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80)) {
            *pp = p;
            *v = x;
            return 0;
        }
    }
    return -1;
}

static inline int scalar_field(uint64_t f) { return f == 3 || f == 4 || f == 5 || f == 7 || f == 8 || f == 9; }

/* One pass over a SyncRequest: counts (fill 0) or fills the arrays sized by the counting pass. */
static int parse_req(const unsigned char *p, const unsigned char *e, Req *r, int fill) {
    r->ng = r->nr = 0;
    for (int i = 0; i < 10; i++) r->f[i].n = 0;
    r->tok = (const unsigned char *)"";
    r->ntokb = 0;
    r->max_tokens = 0;
    while (p < e) {
        uint64_t key, v;
        if (rd_varint(&p, e, &key) < 0) return -1;
        uint64_t field = key >> 3, wt = key & 7;
        if (field == 0) return -1;
        if (wt == 2) {
            uint64_t len;
            if (rd_varint(&p, e, &len) < 0 || len > (uint64_t)(e - p)) return -1;
            const unsigned char *q = p, *qe = p + len;
            p = qe;
            if (field == 1 || field == 2) {
                Str *dst = field == 1 ? r->gids : r->rids;
                Py_ssize_t *cnt = field == 1 ? &r->ng : &r->nr;
                if (fill) dst[*cnt] = (Str){q, (Py_ssize_t)len};
                (*cnt)++;
            } else if (field == 6) {
                r->tok = q;
                r->ntokb = (Py_ssize_t)len;
            } else if (scalar_field(field)) {
                U64s *a = &r->f[field];
                while (q < qe) {
                    if (rd_varint(&q, qe, &v) < 0) return -1;
                    if (fill) a->v[a->n] = v;
                    a->n++;
                }
            } else if (field == 10) {
                return -1;
            }
        } else if (wt == 0) {
            if (rd_varint(&p, e, &v) < 0) return -1;
            if (scalar_field(field)) {
                U64s *a = &r->f[field];
                if (fill) a->v[a->n] = v;
                a->n++;
            } else if (field == 10) {
                r->max_tokens = (int64_t)v;
            } else if (field <= 10) {
                return -1; /* a known field with another wire type */
            }
        } else if (wt == 1 || wt == 5) {
            Py_ssize_t w = wt == 1 ? 8 : 4;
            if (field <= 10 || e - p < w) return -1;
            p += w;
        } else {
            return -1;
        }
    }
    return 0;
}

static inline Py_ssize_t vlen(uint64_t v) {
    Py_ssize_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

static inline unsigned char *vput(unsigned char *p, uint64_t v) {
    while (v >= 0x80) *p++ = (unsigned char)(v | 0x80), v >>= 7;
    *p++ = (unsigned char)v;
    return p;
}

/* a packed repeated field: its size with tag and length (0 if empty) */
static Py_ssize_t packed_size(const int64_t *v, Py_ssize_t n) {
    if (n == 0) return 0;
    Py_ssize_t body = 0;
    for (Py_ssize_t i = 0; i < n; i++) body += vlen((uint64_t)v[i]);
    return 1 + vlen((uint64_t)body) + body;
}

static unsigned char *packed_put(unsigned char *p, int field, const int64_t *v, Py_ssize_t n) {
    if (n == 0) return p;
    Py_ssize_t body = 0;
    for (Py_ssize_t i = 0; i < n; i++) body += vlen((uint64_t)v[i]);
    *p++ = (unsigned char)(field << 3 | 2);
    p = vput(p, (uint64_t)body);
    for (Py_ssize_t i = 0; i < n; i++) p = vput(p, (uint64_t)v[i]);
    return p;
}

static unsigned char *bytes_put(unsigned char *p, int field, const void *src, Py_ssize_t n) {
    if (n == 0) return p;
    *p++ = (unsigned char)(field << 3 | 2);
    p = vput(p, (uint64_t)n);
    memcpy(p, src, (size_t)n);
    return p + n;
}

static PyObject *s_apply, *s_max_tokens_per_group, *s_max_updates, *s_max_tokens_per_update,
    *s_max_id_len, *s_max_fetch_tokens, *s_max_requests;

static int limit_of(PyObject *limits, PyObject *name, int64_t *out) {
    PyObject *v = PyObject_GetAttr(limits, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Appends tokens [0, n) at p (little-endian uint32) to the sequence's Python list and to vals. */
static int list_append_u32(Seq *s, const unsigned char *p, Py_ssize_t n, int64_t *vals, int to_list) {
    for (Py_ssize_t j = 0; j < n; j++, p += 4) {
        vals[j] = (int64_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        if (!to_list) continue; /* (a lazy tree's deferred lists) */
        PyObject *v = PyLong_FromLongLong(vals[j]);
        if (v == NULL || PyList_Append(s->list, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
        Py_DECREF(v);
    }
    return 0;
}

/* what did not go into the tree leaves the sequence's Python list too (keeps the error) */
static void list_trim(Seq *s, Py_ssize_t keep) {
    if (PyList_GET_SIZE(s->list) <= keep) return;
    PyObject *e1, *e2, *e3;
    PyErr_Fetch(&e1, &e2, &e3);
    PyList_SetSlice(s->list, keep, PyList_GET_SIZE(s->list), NULL);
    PyErr_Restore(e1, e2, e3);
}

/* A group's lease renewed by an append (GroupState keeps it in its tree: no Python call). */
static inline void renew(Tree *t, double now) { t->expires_at = now + t->ttl; }

/* A connection's last group lookup (sync_packed's `cache`): a client names the same groups in
 * message after message, so while the store's membership epoch is unchanged and the message's ids
 * are byte for byte the last ones, their str keys and entries are taken from here instead of being
 * decoded and looked up in two dicts each (cold lines in big dicts: most of a message's lookup
 * time). */
#define GROUP_CACHE "seer.dgds.group_cache"
typedef struct {
    uint64_t epoch;
    Py_ssize_t ng;
    unsigned char *ids; /* each id as its length (4 bytes, native) then its bytes */
    PyObject **keys, **entry; /* ng of each (entry: NULL for a group the store did not have) */
} GroupCache;

/* c's references (its first c->ng keys and entries) and memory */
static void group_cache_release(GroupCache *c) {
    for (Py_ssize_t i = 0; i < c->ng; i++) Py_XDECREF(c->keys[i]), Py_XDECREF(c->entry[i]);
    PyMem_Free(c->ids), PyMem_Free(c->keys), PyMem_Free(c->entry), PyMem_Free(c);
}

static void group_cache_free(PyObject *cap) {
    GroupCache *c = PyCapsule_GetPointer(cap, GROUP_CACHE);
    if (c != NULL) group_cache_release(c);
}

static int group_cache_hit(const GroupCache *c, uint64_t epoch, const Str *gids, Py_ssize_t ng) {
    if (c == NULL || c->epoch != epoch || c->ng != ng) return 0;
    const unsigned char *p = c->ids;
    for (Py_ssize_t i = 0; i < ng; i++) {
        uint32_t n;
        memcpy(&n, p, 4);
        if ((Py_ssize_t)n != gids[i].n || memcmp(p + 4, gids[i].p, n) != 0) return 0;
        p += 4 + n;
    }
    return 1;
}

/* A new cache of this message's lookup, in slot 0 of the list `holder`; 0, or -1 with an error. */
static int group_cache_store(PyObject *holder, uint64_t epoch, const Str *gids, Py_ssize_t ng, PyObject **keys,
                             PyObject **entry) {
    GroupCache *c = PyMem_Calloc(1, sizeof(GroupCache));
    if (c == NULL) return PyErr_NoMemory(), -1;
    Py_ssize_t nbytes = 0;
    for (Py_ssize_t i = 0; i < ng; i++) nbytes += 4 + gids[i].n;
    c->ids = PyMem_Malloc((size_t)nbytes + 1);
    c->keys = PyMem_Calloc((size_t)ng + 1, sizeof(PyObject *));
    c->entry = PyMem_Calloc((size_t)ng + 1, sizeof(PyObject *));
    if (c->ids == NULL || c->keys == NULL || c->entry == NULL) {
        group_cache_release(c); /* (ng is still 0: no references yet) */
        return PyErr_NoMemory(), -1;
    }
    unsigned char *p = c->ids;
    for (Py_ssize_t i = 0; i < ng; i++) {
        uint32_t n = (uint32_t)gids[i].n;
        memcpy(p, &n, 4);
        memcpy(p + 4, gids[i].p, n);
        p += 4 + n;
        c->keys[i] = Py_NewRef(keys[i]);
        c->entry[i] = Py_XNewRef(entry[i]);
    }
    c->epoch = epoch, c->ng = ng;
    PyObject *cap = PyCapsule_New(c, GROUP_CACHE, group_cache_free);
    if (cap == NULL) {
        group_cache_release(c);
        return -1;
    }
    return PyList_SetItem(holder, 0, cap); /* (steals cap; the old cache is freed) */
}

static PyObject *sync_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "sync_packed(raw, states, groups, ended, now, limits[, cache, epoch])");
        return NULL;
    }
    /* cache: a one-item list a connection keeps (see GroupCache), or None; epoch: the store's
     * membership epoch (bumped by every group added or dropped) */
    PyObject *holder = nargs == 8 && args[6] != Py_None ? args[6] : NULL;
    uint64_t store_epoch = 0;
    if (holder != NULL) {
        if (!PyList_Check(holder) || PyList_GET_SIZE(holder) != 1) {
            PyErr_SetString(PyExc_TypeError, "sync_packed: cache must be a one-item list");
            return NULL;
        }
        store_epoch = PyLong_AsUnsignedLongLong(args[7]);
        if (store_epoch == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    }
    PyObject *states = args[1], *groups = args[2], *ended = args[3], *limits = args[5];
    double now = PyFloat_AsDouble(args[4]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (!PyDict_Check(states) || !PyDict_Check(groups)) {
        PyErr_SetString(PyExc_TypeError, "sync_packed: states and groups must be dicts");
        return NULL;
    }
    int64_t max_group, max_updates, max_per_update, max_id_len, max_fetch, max_requests;
    if (limit_of(limits, s_max_tokens_per_group, &max_group) < 0 || limit_of(limits, s_max_updates, &max_updates) < 0 ||
        limit_of(limits, s_max_tokens_per_update, &max_per_update) < 0 || limit_of(limits, s_max_id_len, &max_id_len) < 0 ||
        limit_of(limits, s_max_fetch_tokens, &max_fetch) < 0 || limit_of(limits, s_max_requests, &max_requests) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = view.buf, *bend = buf + view.len;

    PyObject *out = NULL, **gkeys = NULL, **rkeys = NULL, **names = NULL;
    Req r;
    memset(&r, 0, sizeof r);
    PyObject **entry = NULL; /* per group: its (state, core, index, pending, names) tuple, or NULL */
    Tree **gtree = NULL, **ftree = NULL;
    int64_t *fcur = NULL, *fend = NULL, *fnext = NULL, *fnseg = NULL, *fnnew = NULL, *more = NULL, *committed = NULL;
    int64_t *unknown = NULL, *endedv = NULL, *vals = NULL;
    int32_t *asid = NULL;
    unsigned char *status = NULL, *segbuf = NULL, *tokbuf = NULL;
    Job *jobs = NULL;
    Py_ssize_t nnames = 0, nmore = 0, nunknown = 0, nended = 0, n = 0, nf = 0, ng = 0;
    int fallback = 1;

    /* 1. parse (two passes: count, then fill) */
    if (parse_req(buf, bend, &r, 0) < 0) goto done;
    r.gids = PyMem_Malloc((size_t)(r.ng + 1) * sizeof(Str));
    r.rids = PyMem_Malloc((size_t)(r.nr + 1) * sizeof(Str));
    int nomem = r.gids == NULL || r.rids == NULL;
    for (int i = 3; i <= 9; i++)
        if (scalar_field(i) && (r.f[i].v = PyMem_Malloc((size_t)(r.f[i].n + 1) * sizeof(uint64_t))) == NULL) nomem = 1;
    if (nomem) {
        PyErr_NoMemory();
        fallback = 0;
        goto done;
    }
    if (parse_req(buf, bend, &r, 1) < 0) goto done;
    n = r.nr, ng = r.ng, nf = r.f[7].n;
    U64s *ag = &r.f[3], *ap = &r.f[4], *al = &r.f[5], *fg = &r.f[7], *fc = &r.f[8], *fk = &r.f[9];

    /* 2. the checks of GroupStore.sync (any failure: None, and it says which) */
    if (ag->n != n || ap->n != n || al->n != n || fc->n != nf || fk->n != nf || n > max_updates) goto done;
    uint64_t ntok = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (ag->v[k] >= (uint64_t)ng || (int64_t)ap->v[k] < 0 || al->v[k] > (uint64_t)max_per_update) goto done;
        ntok += al->v[k];
    }
    if (4 * ntok != (uint64_t)r.ntokb) goto done;
    for (Py_ssize_t i = 0; i < nf; i++)
        if (fg->v[i] >= (uint64_t)ng || fk->v[i] > UINT32_MAX) goto done;
    for (Py_ssize_t i = 0; i < ng; i++)
        if (r.gids[i].n == 0 || r.gids[i].n > max_id_len) goto done;
    for (Py_ssize_t k = 0; k < n; k++)
        if (r.rids[k].n == 0 || r.rids[k].n > max_id_len) goto done;
    int64_t budget = r.max_tokens > 0 && r.max_tokens < max_fetch ? r.max_tokens : max_fetch;

    /* 3. the groups and request ids as str, the groups looked up */
    fallback = 0; /* (from here on an error is an error) */
    gkeys = PyMem_Calloc((size_t)ng + 1, sizeof(PyObject *));
    rkeys = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    entry = PyMem_Calloc((size_t)ng + 1, sizeof(PyObject *));
    gtree = PyMem_Calloc((size_t)ng + 1, sizeof(Tree *));
    if (gkeys == NULL || rkeys == NULL || entry == NULL || gtree == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    GroupCache *gc = NULL;
    if (holder != NULL && PyCapsule_IsValid(PyList_GET_ITEM(holder, 0), GROUP_CACHE))
        gc = PyCapsule_GetPointer(PyList_GET_ITEM(holder, 0), GROUP_CACHE);
    int cached = group_cache_hit(gc, store_epoch, r.gids, ng);
    for (Py_ssize_t i = 0; i < ng && cached; i++) {
        gkeys[i] = Py_NewRef(gc->keys[i]);
        if (gc->entry[i] != NULL) {
            entry[i] = Py_NewRef(gc->entry[i]);
            gtree[i] = (Tree *)PyTuple_GET_ITEM(entry[i], 1);
            PREFETCH(gtree[i]);
        }
    }
    for (Py_ssize_t i = 0; i < ng && !cached; i++) {
        if ((gkeys[i] = PyUnicode_DecodeUTF8((const char *)r.gids[i].p, r.gids[i].n, NULL)) == NULL) goto bad_utf8;
        PyObject *state = PyDict_GetItemWithError(states, gkeys[i]), *e = NULL;
        if (state == NULL && PyErr_Occurred()) goto done;
        if (state != NULL) {
            e = PyDict_GetItemWithError(groups, gkeys[i]);
            if (e == NULL && PyErr_Occurred()) goto done;
            if (e == NULL || !PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 5 || PyTuple_GET_ITEM(e, 0) != state) {
                fallback = 1; /* the two maps disagree (someone edited the store): GroupStore.sync */
                goto done;
            }
            if (!PyObject_TypeCheck(PyTuple_GET_ITEM(e, 1), &TreeType)) {
                PyErr_SetString(PyExc_TypeError, "sync_packed: groups must map ids to (state, core, index, pending, names)");
                goto done;
            }
            entry[i] = Py_NewRef(e); /* (held: state.apply below runs Python) */
            gtree[i] = (Tree *)PyTuple_GET_ITEM(e, 1);
            PREFETCH(gtree[i]);
        }
    }
    if (holder != NULL && !cached && group_cache_store(holder, store_epoch, r.gids, ng, gkeys, entry) < 0) goto done;
    for (Py_ssize_t k = 0; k < n; k++)
        if ((rkeys[k] = PyUnicode_DecodeUTF8((const char *)r.rids[k].p, r.rids[k].n, NULL)) == NULL) goto bad_utf8;

    /* 4. the fetches, from before the message's appends */
    ftree = PyMem_Calloc((size_t)nf + 1, sizeof(Tree *));
    fcur = PyMem_Calloc((size_t)nf + 1, sizeof(int64_t));
    fend = PyMem_Calloc((size_t)nf + 1, sizeof(int64_t));
    fnext = PyMem_Calloc((size_t)nf + 1, sizeof(int64_t));
    fnseg = PyMem_Calloc((size_t)nf + 1, sizeof(int64_t));
    fnnew = PyMem_Calloc((size_t)nf + 1, sizeof(int64_t));
    more = PyMem_Calloc((size_t)nf + 1, sizeof(int64_t));
    if (!ftree || !fcur || !fend || !fnext || !fnseg || !fnnew || !more) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        Tree *t = ftree[i] = gtree[fg->v[i]];
        int64_t c = fcur[i] = (int64_t)fc->v[i];
        if (t == NULL) continue;
        if (c < 0 || c > t->log_n || (int64_t)fk->v[i] > t->nseqs) {
            fallback = 1;
            goto done;
        }
        if (c) PREFETCH(&t->log_seg[4 * (c - 1) + 3]);
        if (t->log_n) PREFETCH(&t->log_seg[4 * (t->log_n - 1) + 3]);
    }
    int64_t total_seg = 0, total_tok = 0, left = budget, total_names = 0;
    for (Py_ssize_t i = 0; i < nf; i++) {
        Tree *t = ftree[i];
        fend[i] = fcur[i];
        if (t == NULL) continue;
        fnnew[i] = t->nseqs - (int64_t)fk->v[i];
        total_names += fnnew[i];
        if (fcur[i] == t->log_n) continue;
        int64_t t0 = fcur[i] ? t->log_seg[4 * (fcur[i] - 1) + 3] : 0, e = t->log_n;
        if (t->log_ntok - t0 > left) { /* as log_fetch: the first segment past the budget, but one */
            int64_t lo = fcur[i] + 1, hi = t->log_n;
            while (lo < hi) {
                int64_t mid = (lo + hi) / 2;
                if (t->log_seg[4 * mid + 3] - t0 <= left) lo = mid + 1; else hi = mid;
            }
            e = lo;
            more[nmore++] = i;
        }
        fend[i] = e;
        int64_t got = t->log_seg[4 * (e - 1) + 3] - t0;
        total_seg += e - fcur[i];
        total_tok += got;
        left = left - got > 1 ? left - got : 1;
    }
    segbuf = PyMem_Malloc((size_t)(12 * total_seg + 1));
    tokbuf = PyMem_Malloc((size_t)(4 * total_tok + 1));
    names = PyMem_Calloc((size_t)total_names + 1, sizeof(PyObject *));
    if (segbuf == NULL || tokbuf == NULL || names == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    unsigned char *sp = segbuf, *tp = tokbuf;
    for (Py_ssize_t i = 0; i < nf; i++) {
        Tree *t = ftree[i];
        fnext[i] = fend[i];
        fnseg[i] = fend[i] - fcur[i];
        if (t == NULL) continue;
        if (fnnew[i]) {
            PyObject *lst = PyTuple_GET_ITEM(entry[fg->v[i]], 4);
            if (!PyList_Check(lst) || PyList_GET_SIZE(lst) != t->nseqs) {
                PyErr_SetString(PyExc_RuntimeError, "sync_packed: request ids and sequences differ");
                goto done;
            }
            for (Py_ssize_t j = t->nseqs - fnnew[i]; j < t->nseqs; j++) names[nnames++] = Py_NewRef(PyList_GET_ITEM(lst, j));
        }
        if (fend[i] == fcur[i]) continue;
        put_log(t, fcur[i], fend[i], &sp, &tp);
    }

    /* 5. the appends */
    status = PyMem_Calloc((size_t)n + 1, 1);
    committed = PyMem_Calloc((size_t)n + 1, sizeof(int64_t));
    asid = PyMem_Malloc((size_t)(n + 1) * sizeof(int32_t));
    vals = PyMem_Malloc((size_t)(ntok + 1) * sizeof(int64_t));
    jobs = PyMem_Malloc((size_t)(n + 1) * sizeof(Job));
    if (!status || !committed || !asid || !vals || !jobs) {
        PyErr_NoMemory();
        goto done;
    }
    /* All simple (each continues its sequence, within its group's limit, with no batches pending,
     * each in a tree of its own)? Then one interleaved batch; otherwise one by one, in order.
     * Either way nothing may fail halfway (a message is applied whole or not at all), so the same
     * pass plans each tree's limits over the whole message, as upper bounds: its tokens (every
     * append's length), its requests (every append of a request it lacks) and its out-of-order
     * batches (every append past its request's length before the message). A message whose plan
     * passes a limit, or names a group with batches pending already, or buffers more than one batch
     * in a group, is left to GroupStore.sync (None), which simulates it exactly and refuses it
     * whole: then no state.apply below can raise TooLarge. */
    static uint64_t epoch = 0;
    epoch++;
    int simple = 1;
    for (Py_ssize_t k = 0; k < n; k++) { /* (each tree's first lines, all at once) */
        Tree *t = gtree[ag->v[k]];
        if (t != NULL) PREFETCH(t->nodes), PREFETCH(t->seqs), PREFETCH((char *)t->seqs + 64);
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *e = entry[ag->v[k]];
        asid[k] = -1;
        if (e == NULL) continue;
        PyObject *pending = PyTuple_GET_ITEM(e, 3), *idx = PyDict_GetItemWithError(PyTuple_GET_ITEM(e, 2), rkeys[k]);
        if (idx == NULL && PyErr_Occurred()) goto done;
        Tree *t = gtree[ag->v[k]];
        Py_ssize_t sid = idx ? PyLong_AsSsize_t(idx) : -1;
        if (sid == -1 && PyErr_Occurred()) goto done;
        int64_t m = (int64_t)al->v[k];
        if (!PyDict_Check(pending) || PyDict_GET_SIZE(pending) || sid >= t->nseqs) {
            fallback = 1;
            goto done;
        }
        if (t->pmark != epoch) t->pmark = epoch, t->pntok = t->ntok, t->pnseq = t->nseqs, t->pbuf = 0;
        if (m > 0) {
            if (sid < 0) t->pnseq++;
            if ((int64_t)ap->v[k] > (sid < 0 ? 0 : t->seqs[sid].len)) t->pbuf++;
            t->pntok += m;
            if (t->pnseq > max_requests || t->pbuf > 1 || t->pntok > max_group) {
                fallback = 1;
                goto done;
            }
        }
        if (sid < 0 || m == 0 || (int64_t)ap->v[k] != t->seqs[sid].len || t->mark == epoch ||
            t->ntok + m > max_group)
            simple = 0;
        t->mark = epoch;
        asid[k] = (int32_t)sid;
    }
    const unsigned char *tokp = r.tok;
    if (simple) {
        Py_ssize_t nj = 0, off = 0;
        for (Py_ssize_t k = 0; k < n; k++) /* every known group's lease is renewed by its appends */
            if (entry[ag->v[k]] != NULL) renew(gtree[ag->v[k]], now);
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t m = (Py_ssize_t)al->v[k];
            if (asid[k] < 0) {
                status[k] = 5; /* UNKNOWN_GROUP */
            } else {
                Tree *t = gtree[ag->v[k]];
                Seq *s = &t->seqs[asid[k]];
                if (list_append_u32(s, tokp + 4 * off, m, vals + off, !t->lists_deferred) < 0) {
                    list_trim(s, s->len);
                    for (Py_ssize_t a = 0; a < nj; a++) list_trim(&jobs[a].t->seqs[jobs[a].sid], jobs[a].t->seqs[jobs[a].sid].len);
                    goto done;
                }
                jobs[nj++] = (Job){t, asid[k], 0, vals + off, m, 0};
                status[k] = 1; /* APPLIED */
                committed[k] = s->len + m;
            }
            off += m;
        }
        if (extend_batch(jobs, nj) < 0) {
            for (Py_ssize_t a = 0; a < nj; a++) {
                Job *j = &jobs[a];
                if (j->done < j->n) extend_end(j->t, j->sid, j->start, j->vals, j->done); /* (interrupted) */
                list_trim(&j->t->seqs[j->sid], j->start + j->done);
            }
            goto done;
        }
    } else { /* GroupStore.sync's loop, step for step */
        Py_ssize_t off = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t m = (Py_ssize_t)al->v[k];
            PyObject *e = entry[ag->v[k]];
            if (e == NULL) {
                status[k] = 5;
                off += m;
                continue;
            }
            renew(gtree[ag->v[k]], now);
            Tree *t = gtree[ag->v[k]];
            PyObject *idx = PyDict_GetItemWithError(PyTuple_GET_ITEM(e, 2), rkeys[k]), *pending = PyTuple_GET_ITEM(e, 3);
            if (idx == NULL && PyErr_Occurred()) goto done;
            Py_ssize_t sid = idx ? PyLong_AsSsize_t(idx) : -1;
            if (sid == -1 && PyErr_Occurred()) goto done;
            if (sid >= 0 && sid < t->nseqs && PyDict_Check(pending) && PyDict_GET_SIZE(pending) == 0 && m > 0 &&
                (int64_t)ap->v[k] == t->seqs[sid].len && t->ntok + m <= max_group) {
                Seq *s = &t->seqs[sid];
                Py_ssize_t len0 = s->len;
                if (list_append_u32(s, tokp + 4 * off, m, vals, !t->lists_deferred) < 0) {
                    list_trim(s, len0);
                    goto done;
                }
                Py_ssize_t got = extend_tree(t, (int32_t)sid, vals, m);
                if (got < m) {
                    list_trim(s, len0 + got);
                    goto done;
                }
                status[k] = 1;
                committed[k] = s->len;
                off += m;
                continue;
            }
            PyObject *lst = PyList_New(m);
            if (lst == NULL) goto done;
            const unsigned char *p = tokp + 4 * off;
            for (Py_ssize_t j = 0; j < m; j++, p += 4) {
                PyObject *v = PyLong_FromUnsignedLong((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                                      (uint32_t)p[3] << 24);
                if (v == NULL) {
                    Py_DECREF(lst);
                    goto done;
                }
                PyList_SET_ITEM(lst, j, v);
            }
            PyObject *prev = PyLong_FromLongLong((int64_t)ap->v[k]);
            PyObject *res = prev ? PyObject_CallMethodObjArgs(PyTuple_GET_ITEM(e, 0), s_apply, rkeys[k], prev, lst, limits, NULL)
                                 : NULL;
            Py_XDECREF(prev);
            Py_DECREF(lst);
            if (res == NULL) goto done;
            long st = -1;
            long long cm = -1;
            if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) {
                st = PyLong_AsLong(PyTuple_GET_ITEM(res, 0));
                cm = PyLong_AsLongLong(PyTuple_GET_ITEM(res, 1));
            }
            Py_DECREF(res);
            if (PyErr_Occurred()) goto done;
            if (st < 0 || st > 255) {
                PyErr_SetString(PyExc_TypeError, "sync_packed: apply() must return (status, committed)");
                goto done;
            }
            status[k] = (unsigned char)st;
            committed[k] = cm;
            off += m;
        }
    }

    /* 6. unknown and ended groups */
    unknown = PyMem_Malloc((size_t)(ng + 1) * sizeof(int64_t));
    endedv = PyMem_Malloc((size_t)(ng + 1) * sizeof(int64_t));
    if (unknown == NULL || endedv == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < ng; i++) {
        if (entry[i] != NULL) continue;
        unknown[nunknown++] = i;
        int c = PySequence_Contains(ended, gkeys[i]);
        if (c < 0) goto done;
        if (c) endedv[nended++] = i;
    }

    /* 7. the SyncResponse */
    Py_ssize_t size = 0, name_bytes = 0;
    if (n) size += 1 + vlen((uint64_t)n) + n;
    size += packed_size(committed, n) + packed_size(fnext, nf) + packed_size(fnseg, nf) + packed_size(fnnew, nf);
    for (Py_ssize_t j = 0; j < nnames; j++) {
        Py_ssize_t len;
        if (PyUnicode_AsUTF8AndSize(names[j], &len) == NULL) goto done;
        size += 1 + vlen((uint64_t)len) + len;
        name_bytes += len;
    }
    if (total_seg) size += 1 + vlen((uint64_t)(12 * total_seg)) + 12 * total_seg;
    if (total_tok) size += 1 + vlen((uint64_t)(4 * total_tok)) + 4 * total_tok;
    size += packed_size(more, nmore) + packed_size(unknown, nunknown) + packed_size(endedv, nended);
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    w = bytes_put(w, 1, status, n);
    w = packed_put(w, 2, committed, n);
    w = packed_put(w, 3, fnext, nf);
    w = packed_put(w, 4, fnseg, nf);
    w = packed_put(w, 5, fnnew, nf);
    for (Py_ssize_t j = 0; j < nnames; j++) {
        Py_ssize_t len;
        const char *u = PyUnicode_AsUTF8AndSize(names[j], &len);
        *w++ = 6 << 3 | 2;
        w = vput(w, (uint64_t)len);
        memcpy(w, u, (size_t)len);
        w += len;
    }
    w = bytes_put(w, 7, segbuf, 12 * total_seg);
    w = bytes_put(w, 8, tokbuf, 4 * total_tok);
    w = packed_put(w, 9, more, nmore);
    w = packed_put(w, 10, unknown, nunknown);
    w = packed_put(w, 11, endedv, nended);
    if (w != (unsigned char *)PyBytes_AS_STRING(out) + size) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_RuntimeError, "sync_packed: response size mismatch");
    }
    goto done;

bad_utf8:
    PyErr_Clear();
    fallback = 1;
done:
    PyBuffer_Release(&view);
    if (gkeys)
        for (Py_ssize_t i = 0; i < ng; i++) Py_XDECREF(gkeys[i]);
    if (rkeys)
        for (Py_ssize_t k = 0; k < n; k++) Py_XDECREF(rkeys[k]);
    if (entry)
        for (Py_ssize_t i = 0; i < ng; i++) Py_XDECREF(entry[i]);
    for (Py_ssize_t j = 0; j < nnames; j++) Py_DECREF(names[j]);
    PyMem_Free(gkeys), PyMem_Free(rkeys), PyMem_Free(names), PyMem_Free(entry), PyMem_Free(gtree), PyMem_Free(ftree);
    PyMem_Free(r.gids), PyMem_Free(r.rids);
    for (int i = 3; i <= 9; i++) PyMem_Free(r.f[i].v);
    PyMem_Free(fcur), PyMem_Free(fend), PyMem_Free(fnext), PyMem_Free(fnseg), PyMem_Free(fnnew), PyMem_Free(more);
    PyMem_Free(committed), PyMem_Free(unknown), PyMem_Free(endedv), PyMem_Free(vals), PyMem_Free(asid);
    PyMem_Free(status), PyMem_Free(segbuf), PyMem_Free(tokbuf), PyMem_Free(jobs);
    if (out == NULL && fallback && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* ---- the type --------------------------------------------------------------------------------- */

static int Tree_init(Tree *t, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"max_depth", "log", "lazy", NULL};
    int max_depth = 64, log_on = 0, lazy = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|ipp:Tree", kw, &max_depth, &log_on, &lazy)) return -1;
    if (lazy && !log_on) {
        PyErr_SetString(PyExc_ValueError, "a lazy tree needs log=True (it is built by replaying its log)");
        return -1;
    }
    if (max_depth < 2 || max_depth > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "max_depth must be in [2, 2**20]");
        return -1;
    }
    if (t->nodes != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Tree is already initialized");
        return -1;
    }
    t->max_depth = max_depth;
    t->log_on = log_on;
    t->deferred = lazy;
    t->lists_deferred = lazy;
    t->free_head = NONE;
    if ((t->scratch = PyMem_Malloc((size_t)(max_depth + 1) * sizeof(int32_t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if ((t->pyseqs = PyList_New(0)) == NULL) return -1;
    if (reserve(t, 1) < 0) return -1;
    new_node(t, -1, 0, 0, -1, -1, NONE); /* the root: id 0 */
    ND(0).growing = 0;
    t->num_nodes = 1;
    return 0;
}

static void Tree_dealloc(Tree *t) {
    for (int32_t i = 0; i < t->nseqs; i++) {
        PyMem_Free(t->seqs[i].tok);
        PyMem_Free(t->seqs[i].act);
        Py_XDECREF(t->seqs[i].list);
    }
    PyMem_Free(t->seqs);
    PyMem_Free(t->scratch);
    PyMem_Free(t->nodes);
    PyMem_Free(t->tab);
    PyMem_Free(t->log_seg);
    PyMem_Free(t->log_tok);
    Py_XDECREF(t->pyseqs);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef Tree_methods[] = {
    {"extend", (PyCFunction)(void (*)(void))Tree_extend, METH_FASTCALL,
     "extend(seq_id, tokens): append tokens to a sequence (SuffixTree.extend)"},
    {"add_sequence", (PyCFunction)Tree_add_sequence, METH_NOARGS, "add_sequence() -> new sequence id"},
    {"append_at", (PyCFunction)(void (*)(void))Tree_append_at, METH_FASTCALL,
     "append_at(seq_id, prev, buf, off, n, max_tokens) -> new length, or -1 / -2 (unchanged)"},
    {"count", (PyCFunction)Tree_count, METH_O, "count(pattern) -> occurrences"},
    {"draft", (PyCFunction)(void (*)(void))Tree_draft, METH_FASTCALL,
     "draft(context, params[, rank]) -> (paths, match_len): drafting.draft"},
    {"dump", (PyCFunction)Tree_dump, METH_NOARGS, "every node, parents first (see SuffixTree.root)"},
    {"materialize", (PyCFunction)Tree_materialize, METH_NOARGS, "build a lazy tree now (any read does)"},
    {"seq_len", (PyCFunction)Tree_seq_len, METH_O, "seq_len(seq_id) -> its length"},
    {"seq_tokens", (PyCFunction)(void (*)(void))Tree_seq_tokens, METH_FASTCALL,
     "seq_tokens(seq_id, start, stop) -> its tokens [start, stop) as a list"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Tree_getset[] = {
    {"seqs", (getter)Tree_get_seqs, NULL, "the sequences (lists of ints; do not mutate)", NULL},
    {"num_nodes", (getter)Tree_get_num_nodes, NULL, "(builds a lazy tree)", NULL},
    {"deferred", (getter)Tree_get_deferred, NULL, "a lazy tree not built yet (no nodes)", NULL},
    {"ttl", (getter)Tree_get_ttl, (setter)Tree_set_ttl, "the draft server's lease: its length (s)", NULL},
    {"expires_at", (getter)Tree_get_expires_at, (setter)Tree_set_expires_at, "the lease's end (clock s)", NULL},
    {"num_tokens", (getter)Tree_get_num_tokens, NULL, NULL, NULL},
    {"max_depth", (getter)Tree_get_max_depth, NULL, NULL, NULL},
    {"version", (getter)Tree_get_version, NULL, "bumped by every extend", NULL},
    {"log_size", (getter)Tree_get_log_size, NULL, "segments in the append log (Tree(log=True))", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TreeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "seer.dgds.tree._suffix_core.Tree",
    .tp_basicsize = sizeof(Tree),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A group's suffix tree in C (see seer.dgds.tree.suffix_tree)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tree_init,
    .tp_dealloc = (destructor)Tree_dealloc,
    .tp_methods = Tree_methods,
    .tp_getset = Tree_getset,
};

static PyObject *bind(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the DraftPath class");
        return NULL;
    }
    Py_XSETREF(draft_path_type, Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(DraftPath): the class drafts are returned as"},
    {"log_fetch", (PyCFunction)(void (*)(void))log_fetch, METH_FASTCALL,
     "log_fetch(trees, cursors, known, max_tokens) -> (next, segments, new_requests, more, segs, toks)"},
    {"sync_packed", (PyCFunction)(void (*)(void))sync_packed, METH_FASTCALL,
     "sync_packed(raw, states, groups, ended, now, limits) -> serialized SyncResponse, or None (GroupStore.sync)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_suffix_core", NULL, -1, methods};

PyMODINIT_FUNC PyInit__suffix_core(void) {
    if (PyType_Ready(&TreeType) < 0) return NULL;
    if (!(s_tokens = PyUnicode_InternFromString("tokens")) || !(s_probs = PyUnicode_InternFromString("probs")) ||
        !(s_max_spec = PyUnicode_InternFromString("max_spec_tokens")) ||
        !(s_lmin = PyUnicode_InternFromString("pattern_lookup_min")) ||
        !(s_lmax = PyUnicode_InternFromString("pattern_lookup_max")) ||
        !(s_topk = PyUnicode_InternFromString("top_k")) || !(s_floor = PyUnicode_InternFromString("min_token_prob")) ||
        !(s_apply = PyUnicode_InternFromString("apply")) ||
        !(s_max_tokens_per_group = PyUnicode_InternFromString("max_tokens_per_group")) ||
        !(s_max_updates = PyUnicode_InternFromString("max_updates_per_call")) ||
        !(s_max_tokens_per_update = PyUnicode_InternFromString("max_tokens_per_update")) ||
        !(s_max_id_len = PyUnicode_InternFromString("max_id_len")) ||
        !(s_max_fetch_tokens = PyUnicode_InternFromString("max_fetch_tokens")) ||
        !(s_max_requests = PyUnicode_InternFromString("max_requests_per_group")))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Tree", (PyObject *)&TreeType) < 0 ||
        PyModule_AddIntConstant(m, "EXACT_RANK", PY_VERSION_HEX < 0x030C0000) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_SHA256", SEER_CORE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
