"""attnbook: the code of the book *Attention, from first principles*.

Every piece of code that more than one notebook, the command line or the tests use lives here.
The notebooks build each piece inline first, to teach it, and then check that it agrees with
the version in this package.

Conventions used everywhere (see book/notation.md):

* shapes: B batch, S source length, T target length, d_model, d_k, d_v, h heads, V vocabulary;
* a boolean mask is ``True`` where attention is allowed (a real token, a visible position) and
  ``False`` where it is blocked (padding, the future) -- the same convention as
  ``torch.nn.functional.scaled_dot_product_attention``;
* special token ids: ``PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3``.
"""

__version__ = "0.1.0"

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
