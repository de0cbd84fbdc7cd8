/* Compiled append for seer/dgds/suffix_tree.py: SuffixTree.extend in C.
 *
 * The tree stays made of the Python `Node` objects of suffix_tree.py (every reader -- drafting,
 * locate, replicas, snapshots -- keeps using them as before); this module only runs the append
 * loop, reading and writing the nodes' __slots__ directly at the offsets their member descriptors
 * give (`bind(Node)`, called once at import). The algorithm is line for line the pure-Python
 * `SuffixTree._extend` (the reference, and the fallback when this module is not built); tests run
 * both and require identical trees.
 *
 * One difference: nodes made here keep no `parent` reference (None). The one place that needs a
 * parent, a node absorbed by its child, finds it by walking the window's own tokens from the root.
 * Without parent links a tree is acyclic (root -> children dicts -> nodes), so reference counting
 * frees it and its nodes and dicts are untracked by the cyclic GC, which otherwise costs about as
 * much as the appends themselves (every collection would walk the whole, ever-growing tree).
 *
 * Built by `pip install -e .` (setup.py, optional: a failed build leaves the Python version).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyTypeObject *node_type = NULL;
static Py_ssize_t OFF_CHILDREN, OFF_PARENT, OFF_COUNT, OFF_LENGTH, OFF_REF_SEQ, OFF_REF_IDX, OFF_GROWING;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* The int in a slot (always an int: only suffix_tree.py and this file write them). */
static inline Py_ssize_t geti(PyObject *o, Py_ssize_t off) {
    PyObject *x = SLOT(o, off);
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)x)) return PyUnstable_Long_CompactValue((PyLongObject *)x);
#else
    Py_ssize_t size = Py_SIZE(x); /* one 30-bit digit at most: the value is digit * sign */
    if (size >= -1 && size <= 1) return size * (Py_ssize_t)((PyLongObject *)x)->ob_digit[0];
#endif
    return PyLong_AsSsize_t(x);
}

static inline int seti(PyObject *o, Py_ssize_t off, Py_ssize_t v) {
    if (geti(o, off) == v) return 0; /* unchanged: no new int object */
    PyObject *x = PyLong_FromSsize_t(v);
    if (x == NULL) return -1;
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = x;
    Py_XDECREF(old);
    return 0;
}

/* o.<slot> = v (a new strong reference to v) */
static inline void seto(PyObject *o, Py_ssize_t off, PyObject *v) {
    Py_INCREF(v);
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = v;
    Py_XDECREF(old);
}

/* o.<slot> = v, stealing the reference to v */
static inline void steal(PyObject *o, Py_ssize_t off, PyObject *v) {
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = v;
    Py_XDECREF(old);
}

/* Node(None, count, length, ref_seq, ref_idx) without running __init__, untracked; new reference. */
static PyObject *new_node(Py_ssize_t count, Py_ssize_t length, Py_ssize_t ref_seq, Py_ssize_t ref_idx) {
    PyObject *n = node_type->tp_alloc(node_type, 0);
    if (n == NULL) return NULL;
    PyObject_GC_UnTrack(n);
    SLOT(n, OFF_CHILDREN) = Py_NewRef(Py_None);
    SLOT(n, OFF_PARENT) = Py_NewRef(Py_None);
    SLOT(n, OFF_GROWING) = Py_NewRef(count == 1 ? Py_True : Py_False);
    if ((SLOT(n, OFF_COUNT) = PyLong_FromSsize_t(count)) == NULL ||
        (SLOT(n, OFF_LENGTH) = PyLong_FromSsize_t(length)) == NULL ||
        (SLOT(n, OFF_REF_SEQ) = PyLong_FromSsize_t(ref_seq)) == NULL ||
        (SLOT(n, OFF_REF_IDX) = PyLong_FromSsize_t(ref_idx)) == NULL) {
        Py_DECREF(n);
        return NULL;
    }
    return n;
}

/* d[key] = value, keeping the children dict out of the cyclic GC (inserting re-tracks it). */
static inline int dict_set(PyObject *d, PyObject *key, PyObject *value) {
    int rc = PyDict_SetItem(d, key, value);
    PyObject_GC_UnTrack(d);
    return rc;
}

/* The node whose child is `target`, where the window seq[j:] ends (walked from the root: every node
 * on the way has children, so its stored length is exact); borrowed reference. */
static PyObject *find_parent(PyObject *root, PyObject *seq, Py_ssize_t j, PyObject *target) {
    PyObject *node = root;
    Py_ssize_t p = j, n = PyList_GET_SIZE(seq);
    while (p < n) {
        PyObject *children = SLOT(node, OFF_CHILDREN);
        if (children == Py_None) break;
        PyObject *c = PyDict_GetItemWithError(children, PyList_GET_ITEM(seq, p));
        if (c == NULL) break;
        if (c == target) return node;
        p += geti(c, OFF_LENGTH);
        node = c;
    }
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "suffix tree: a window's node has no parent");
    return NULL;
}

static int slot_offset(PyObject *cls, const char *name, Py_ssize_t *out) {
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (d == NULL) return -1;
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type) || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        Py_DECREF(d);
        PyErr_Format(PyExc_TypeError, "Node.%s is not a __slots__ member", name);
        return -1;
    }
    *out = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return 0;
}

static PyObject *bind(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the Node class");
        return NULL;
    }
    if (slot_offset(cls, "children", &OFF_CHILDREN) || slot_offset(cls, "parent", &OFF_PARENT) ||
        slot_offset(cls, "count", &OFF_COUNT) || slot_offset(cls, "length", &OFF_LENGTH) ||
        slot_offset(cls, "ref_seq", &OFF_REF_SEQ) || slot_offset(cls, "ref_idx", &OFF_REF_IDX) ||
        slot_offset(cls, "growing", &OFF_GROWING))
        return NULL;
    Py_XSETREF(node_type, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyObject *get_list(PyObject *tree, const char *name, Py_ssize_t idx) {
    PyObject *all = PyObject_GetAttrString(tree, name);
    if (all == NULL) return NULL;
    if (!PyList_Check(all) || idx < 0 || idx >= PyList_GET_SIZE(all)) {
        Py_DECREF(all);
        PyErr_Format(PyExc_IndexError, "no sequence %zd", idx);
        return NULL;
    }
    PyObject *item = Py_NewRef(PyList_GET_ITEM(all, idx));
    Py_DECREF(all);
    return item;
}

/* One token for every window of the sequence (see SuffixTree._extend); -1 on error. */
static int step(PyObject *seqs, PyObject *seq, PyObject *active, PyObject *root, Py_ssize_t seq_id,
                Py_ssize_t max_depth, Py_ssize_t *lo_p, Py_ssize_t *created_p, PyObject *tok) {
    Py_ssize_t lo = *lo_p, created = 0;
    Py_ssize_t n = PyList_GET_SIZE(seq); /* position of tok */
    if (PyList_Append(active, root) < 0) return -1;
    if (seti(root, OFF_COUNT, geti(root, OFF_COUNT) + 1) < 0) return -1;
    if (PyList_GET_SIZE(active) > max_depth) {
        /* The oldest window is max_depth long: it stops growing. */
        if (lo) {
            PyObject *old = PyList_GET_ITEM(active, 0);
            if (seti(old, OFF_LENGTH, n - geti(old, OFF_REF_IDX)) < 0) return -1;
            seto(old, OFF_GROWING, Py_False);
            lo--;
        }
        if (PyList_SetSlice(active, 0, 1, NULL) < 0) return -1;
    }
    if (PyList_Append(seq, tok) < 0) return -1;
    Py_ssize_t end = n + 1;
    Py_ssize_t na = PyList_GET_SIZE(active);
    for (Py_ssize_t i = lo; i < na; i++) {
        PyObject *node = PyList_GET_ITEM(active, i); /* borrowed: the tree (or active) holds it */
        PyObject *children = SLOT(node, OFF_CHILDREN);
        if (children == Py_None) {
            /* a leaf other windows ended at too (count >= 2): this window branches off */
            PyObject *nw = new_node(1, 1, seq_id, n);
            if (nw == NULL) return -1;
            PyObject *d = PyDict_New();
            if (d == NULL || dict_set(d, tok, nw) < 0) {
                Py_XDECREF(d);
                Py_DECREF(nw);
                return -1;
            }
            steal(node, OFF_CHILDREN, d);
            PyList_SET_ITEM(active, i, nw); /* steals nw; node stays referenced by its parent */
            Py_DECREF(node);
            created++;
            continue;
        }
        PyObject *child = PyDict_GetItemWithError(children, tok); /* borrowed */
        if (child == NULL) {
            if (PyErr_Occurred()) return -1;
            PyObject *nw = new_node(1, 1, seq_id, n);
            if (nw == NULL) return -1;
            if (dict_set(children, tok, nw) < 0) {
                Py_DECREF(nw);
                return -1;
            }
            PyList_SET_ITEM(active, i, nw);
            Py_DECREF(node);
            created++;
            continue;
        }
        Py_ssize_t clen = geti(child, OFF_LENGTH);
        if (SLOT(child, OFF_GROWING) == Py_True && geti(child, OFF_REF_SEQ) == seq_id)
            clen = end - geti(child, OFF_REF_IDX); /* an open leaf of this sequence: not written yet */
        Py_ssize_t ccount = geti(child, OFF_COUNT);
        if (geti(node, OFF_COUNT) == ccount + 1 && node != root) {
            Py_ssize_t nlen = geti(node, OFF_LENGTH);
            if (clen == 1) {
                /* The boundary reaches `child`: `child` absorbs `node`. */
                PyObject *parent = find_parent(root, seq, n - (na - 1) + i, node);
                if (parent == NULL) return -1;
                PyObject *nseq = PyList_GET_ITEM(seqs, geti(node, OFF_REF_SEQ));
                PyObject *first = PyList_GET_ITEM(nseq, geti(node, OFF_REF_IDX));
                if (seti(child, OFF_COUNT, ccount + 1) < 0 || seti(child, OFF_LENGTH, nlen + 1) < 0 ||
                    seti(child, OFF_REF_SEQ, seq_id) < 0 || seti(child, OFF_REF_IDX, end - (nlen + 1)) < 0)
                    return -1;
                Py_INCREF(child);
                Py_INCREF(node);
                seto(child, OFF_GROWING, Py_False);
                int rc = dict_set(SLOT(parent, OFF_CHILDREN), first, child);
                PyList_SET_ITEM(active, i, child); /* steals our reference to child */
                Py_DECREF(node);                   /* the list's reference */
                Py_DECREF(node);                   /* ours: node may be freed now */
                if (rc < 0) return -1;
                created--;
            } else {
                /* This window ends at `node`, and every other window through `node` continues
                 * with `tok`: the node boundary moves one token down. */
                if (seti(node, OFF_LENGTH, nlen + 1) < 0 || seti(node, OFF_REF_SEQ, seq_id) < 0 ||
                    seti(node, OFF_REF_IDX, end - (nlen + 1)) < 0 || seti(child, OFF_LENGTH, clen - 1) < 0)
                    return -1;
                Py_ssize_t idx = geti(child, OFF_REF_IDX) + 1;
                if (seti(child, OFF_REF_IDX, idx) < 0) return -1;
                PyObject *head = PyList_GET_ITEM(PyList_GET_ITEM(seqs, geti(child, OFF_REF_SEQ)), idx);
                int same = PyObject_RichCompareBool(head, tok, Py_EQ);
                if (same < 0) return -1;
                if (!same) {
                    Py_INCREF(child);
                    int rc = PyDict_DelItem(children, tok);
                    if (rc == 0) rc = dict_set(children, head, child);
                    Py_DECREF(child);
                    if (rc < 0) return -1;
                }
            }
        } else if (clen == 1) {
            if (seti(child, OFF_COUNT, ccount + 1) < 0) return -1;
            seto(child, OFF_GROWING, Py_False);
            Py_INCREF(child);
            PyList_SET_ITEM(active, i, child);
            Py_DECREF(node);
        } else {
            /* Split `child` after its first token; the window ends at the split point. */
            PyObject *mid = new_node(ccount + 1, 1, seq_id, n);
            if (mid == NULL) return -1;
            Py_ssize_t idx = geti(child, OFF_REF_IDX) + 1;
            if (seti(child, OFF_LENGTH, clen - 1) < 0 || seti(child, OFF_REF_IDX, idx) < 0) {
                Py_DECREF(mid);
                return -1;
            }
            PyObject *head = PyList_GET_ITEM(PyList_GET_ITEM(seqs, geti(child, OFF_REF_SEQ)), idx);
            PyObject *d = PyDict_New();
            if (d == NULL || dict_set(d, head, child) < 0) {
                Py_XDECREF(d);
                Py_DECREF(mid);
                return -1;
            }
            steal(mid, OFF_CHILDREN, d);
            if (dict_set(children, tok, mid) < 0) {
                Py_DECREF(mid);
                return -1;
            }
            PyList_SET_ITEM(active, i, mid);
            Py_DECREF(node);
            created++;
        }
    }
    /* Windows that now reached a leaf of their own join the open prefix. */
    na = PyList_GET_SIZE(active);
    while (lo < na && geti(PyList_GET_ITEM(active, lo), OFF_COUNT) == 1) lo++;
    *lo_p = lo;
    *created_p += created;
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *extend(PyObject *self, PyObject *args) {
    PyObject *tree, *tokens;
    Py_ssize_t seq_id;
    if (!PyArg_ParseTuple(args, "OnO:extend", &tree, &seq_id, &tokens)) return NULL;
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind(Node) first");
        return NULL;
    }
    PyObject *seqs = NULL, *seq = NULL, *active = NULL, *open_all = NULL, *root = NULL, *it = NULL;
    PyObject *result = NULL;
    Py_ssize_t lo = 0, created = 0, max_depth;
    int ok = 0, started = 0;

    if ((seqs = PyObject_GetAttrString(tree, "seqs")) == NULL || !PyList_Check(seqs)) goto done;
    if ((seq = get_list(tree, "seqs", seq_id)) == NULL || !PyList_Check(seq)) goto done;
    if ((active = get_list(tree, "_active", seq_id)) == NULL || !PyList_Check(active)) goto done;
    if ((open_all = PyObject_GetAttrString(tree, "_open")) == NULL || !PyList_Check(open_all)) goto done;
    if ((root = PyObject_GetAttrString(tree, "root")) == NULL) goto done;
    {
        PyObject *md = PyObject_GetAttrString(tree, "max_depth");
        if (md == NULL) goto done;
        max_depth = PyLong_AsSsize_t(md);
        Py_DECREF(md);
        if (max_depth == -1 && PyErr_Occurred()) goto done;
    }
    lo = PyLong_AsSsize_t(PyList_GET_ITEM(open_all, seq_id)); /* active[:lo] are open leaves */
    if (lo == -1 && PyErr_Occurred()) goto done;
    /* Other sequences may have repeated some of them since (count 2 now): still a prefix. */
    while (lo && geti(PyList_GET_ITEM(active, lo - 1), OFF_COUNT) != 1) lo--;
    started = 1;
    if ((it = PyObject_GetIter(tokens)) == NULL) goto done;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        PyObject *tok = PyNumber_Index(item);
        Py_DECREF(item);
        if (tok == NULL) goto done;
        int rc = step(seqs, seq, active, root, seq_id, max_depth, &lo, &created, tok);
        Py_DECREF(tok);
        if (rc < 0) goto done;
    }
    if (!PyErr_Occurred()) ok = 1;

done:
    if (started) {
        /* Write the open leaves' lengths, keep the open prefix and the node count (also on error,
         * like the Python version's `finally`). */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        Py_ssize_t end = PyList_GET_SIZE(seq);
        for (Py_ssize_t i = 0; i < lo; i++) {
            PyObject *leaf = PyList_GET_ITEM(active, i);
            if (seti(leaf, OFF_LENGTH, end - geti(leaf, OFF_REF_IDX)) < 0) ok = 0;
        }
        PyObject *lo_obj = PyLong_FromSsize_t(lo);
        if (lo_obj == NULL || PyList_SetItem(open_all, seq_id, lo_obj) < 0) ok = 0;
        PyObject *nn = PyObject_GetAttrString(tree, "num_nodes");
        if (nn != NULL) {
            PyObject *delta = PyLong_FromSsize_t(created);
            PyObject *sum = delta ? PyNumber_Add(nn, delta) : NULL;
            if (sum == NULL || PyObject_SetAttrString(tree, "num_nodes", sum) < 0) ok = 0;
            Py_XDECREF(sum);
            Py_XDECREF(delta);
            Py_DECREF(nn);
        } else {
            ok = 0;
        }
        if (exc_type != NULL) {
            PyErr_Restore(exc_type, exc_value, exc_tb);
            ok = 0;
        }
    }
    if (ok) result = Py_NewRef(Py_None);
    else if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "extend(tree, seq_id, tokens): bad tree");
    Py_XDECREF(it);
    Py_XDECREF(root);
    Py_XDECREF(open_all);
    Py_XDECREF(active);
    Py_XDECREF(seq);
    Py_XDECREF(seqs);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(Node): learn the slot offsets of suffix_tree.Node"},
    {"extend", extend, METH_VARARGS, "extend(tree, seq_id, tokens): SuffixTree.extend"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_suffix_core", NULL, -1, methods};

PyMODINIT_FUNC PyInit__suffix_core(void) { return PyModule_Create(&module); }
