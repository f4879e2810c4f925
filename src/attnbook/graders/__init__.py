"""Homework graders: one checking function per coding exercise of the book.

A grader tests the reader's function or module against a reference on random inputs and edge
cases (a batch of 1, length 1, masked positions, other dtypes) and reports either one success
line or a precise hint: which input, which shape or value, what was expected and what came back.
It never just says "wrong" and never passes a stub.

In a notebook the reader calls ``check_masked_softmax(masked_softmax)``, which prints one line. The
grading command (``python -m attnbook homework``) looks graders up by exercise label in
``GRADERS`` and calls ``GRADERS[label].grade(obj)``, which returns a :class:`GradeResult` instead
of printing.

Layout: :mod:`.core` holds what every grader shares (:class:`Hint`, :class:`GradeResult`,
:class:`Grader`, the registry ``GRADERS`` and its decorator :func:`grader`, the ``expect_*``
helpers); each chapter's graders live in their own module, named after the chapter's notebook
(``ch00_setup`` .. ``ch13_beyond_attention``; the workshop's in ``workshop``, ``workshop_blocks`` and
``gallery``), and are imported here in book order, which is the order of ``GRADERS``. The graders
import the library; the library never imports them.
"""
from .ch00_setup import check_pad_batch
from .ch01_bottleneck import check_gru_encode
from .ch02_additive_attention import check_bilinear_attention, check_masked_softmax
from .ch03_dot_product_attention import check_concat_score, check_soft_argmax, check_soft_lookup
from .ch04_scaled_dot_product import (check_attention_entropy, check_chunked_attention,
                                      check_scaled_dot_product_attention)
from .ch05_multi_head_attention import (check_head_contributions, check_multi_head_self_attention,
                                        check_multi_query_attention)
from .ch06_masking_cross_attention import (check_leaks_future, check_make_causal_mask,
                                           check_make_decoder_mask)
from .ch07_positional_encoding import check_apply_rope, check_sinusoid_table
from .ch08_transformer import check_next_token, check_pre_ln_encoder_block, check_transformer_params
from .ch09_training import check_corpus_bleu, check_modified_precision, check_smoothed_nll
from .ch10_fair_race import check_perm_p
from .ch12_decoder_only import (check_cached_attention_step, check_prompt_target,
                                check_temperature_softmax, check_top_k_filter)
from .ch13_beyond_attention import check_combine, check_online_update, check_selective_step
from .workshop import check_beam_search, check_train_step
from .workshop_blocks import check_decode_step, check_decoder_block
from .gallery import (check_gallery_corpus_bleu, check_label_smoothed_loss, check_lm_mask,
                      check_masked_weights, check_padded_attention)
from .core import (GRADERS, GradeResult, Grader, Hint, expect_close, expect_pair, expect_shape,
                   grader)

__all__ = [
    "GRADERS", "GradeResult", "Grader", "Hint", "expect_close", "expect_pair", "expect_shape",
    "grader",
    "check_pad_batch",
    "check_gru_encode",
    "check_bilinear_attention", "check_masked_softmax",
    "check_concat_score", "check_soft_lookup", "check_soft_argmax",
    "check_scaled_dot_product_attention", "check_attention_entropy", "check_chunked_attention",
    "check_multi_head_self_attention", "check_head_contributions", "check_multi_query_attention",
    "check_make_causal_mask", "check_make_decoder_mask", "check_leaks_future",
    "check_sinusoid_table", "check_apply_rope",
    "check_pre_ln_encoder_block", "check_transformer_params", "check_next_token",
    "check_smoothed_nll", "check_modified_precision", "check_corpus_bleu",
    "check_perm_p",
    "check_top_k_filter", "check_temperature_softmax", "check_prompt_target",
    "check_cached_attention_step",
    "check_beam_search", "check_decoder_block", "check_train_step", "check_decode_step",
    "check_masked_weights", "check_padded_attention", "check_lm_mask",
    "check_gallery_corpus_bleu", "check_label_smoothed_loss",
]
