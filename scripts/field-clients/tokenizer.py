"""Builds the tokenizer both clients count with, saved as a transformers tokenizer folder: one
token per whitespace-separated word, the simulator's rule, so a client's count and the usage
the gateway relays can be compared exactly. Its words are Faker's, as guidellm's synthetic text
writes them (capitalised at a sentence's start, a full stop at its end); anything else is one
`[UNK]` token, kept when decoded (not a special token: guidellm and inference-perf decode with
`skip_special_tokens`, which would drop it). Run by a client's Python: tokenizers,
transformers and faker come with both. Nothing is fetched from a model hub."""

import sys

from faker.providers.lorem.en_US import Provider
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

words = ["[UNK]"]
for w in Provider.word_list:
    words += [w, w.capitalize(), w + ".", w.capitalize() + "."]
vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(sys.argv[1])
