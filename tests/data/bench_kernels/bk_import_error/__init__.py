"""Fails to import, like an extension with an undefined symbol."""

raise ImportError("undefined symbol: _ZN3c1010TensorImpl")
