"""The group suffix tree (``suffix_tree``, compiled core ``_suffix_core.c``) and drafting from it
(``drafting``). Importing ``suffix_tree`` requires the core to be built (see its docstring)."""
