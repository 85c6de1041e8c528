#!/usr/bin/env python3
"""Generates the chat-template parity fixtures with transformers (the reference).

    python3 tools/make_chat_fixtures.py OUT_DIR   (needs transformers and tokenizers)

and copy OUT_DIR over tests/fixtures/chat/. For each built-in template NAME it
writes a model-like folder NAME/ with
  tokenizer.json          a fixture tokenizer of tools/make_tokenizer_fixtures.py,
                          with the family's special tokens added
  tokenizer_config.json   bos_token, eos_token and the model's own chat_template
                          (for qwen2.5 the template goes to chat_template.jinja, as
                          transformers 4.43+ saves it)
  chats.jsonl             {"messages": [...]}: conversations with hard text
  expected.jsonl          {"input_ids", "assistant_masks"}: apply_chat_template(
                          tokenize=True, return_assistant_tokens_mask=True) with the
                          template marked up with {% generation %} blocks around each
                          assistant turn's trained text (the marked-up template renders
                          the same text as the model's own; checked here)
"""
import json
import os
import random
import sys

import zlib

import transformers
try:
    from transformers import PreTrainedTokenizerFast
except ImportError:  # transformers 5 names the tokenizers-backed class TokenizersBackend
    from transformers import TokenizersBackend as PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_fixtures as tf  # noqa: E402

RAISE_ALT = "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"

# The models' own templates (Hugging Face model repositories' tokenizer_config.json).
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA3_MARKED = ("{% for message in messages %}{% set header = '<|start_header_id|>' + message['role'] + "
                 "'<|end_header_id|>\n\n' %}{% if loop.index0 == 0 %}{% set header = bos_token + header %}"
                 "{% endif %}{{ header }}{% if message['role'] == 'assistant' %}{% generation %}"
                 "{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}"
                 "{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}")


def chatml(default_system):
    first = ("{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n" + default_system +
             "<|im_end|>\n' }}{% endif %}") if default_system else ""
    own = ("{% for message in messages %}" + first + "{{'<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")
    marked = ("{% for message in messages %}" + first + "{{ '<|im_start|>' + message['role'] + '\n' }}"
              "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
              "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}"
              "{% endfor %}")
    return own, marked


def mistral(space_after_eos):
    tail = " + ' '" if space_after_eos else ""
    own = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
           "(loop.index0 % 2 == 0) %}" + RAISE_ALT + "{% endif %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
           "{{ message['content'] + eos_token" + tail + "}}{% else %}{{ raise_exception('Only user and "
           "assistant roles are supported!') }}{% endif %}{% endfor %}")
    marked = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
              "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{% generation %}"
              "{{ message['content'] + eos_token }}{% endgeneration %}" +
              ("{{ ' ' }}" if space_after_eos else "") + "{% endif %}{% endfor %}")
    return own, marked


LLAMA2_HEAD = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
               "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
               "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == "
               "'user') != (loop.index0 % 2 == 0) %}" + RAISE_ALT + "{% endif %}{% if loop.index0 == 0 and "
               "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
               "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
               "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
               "{% elif message['role'] == 'assistant' %}")
LLAMA2 = LLAMA2_HEAD + "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
LLAMA2_MARKED = (LLAMA2_HEAD + "{{ ' ' }}{% generation %}{{ content.strip() + ' ' + eos_token }}"
                 "{% endgeneration %}{% endif %}{% endfor %}")

QWEN2_SYSTEM = "You are a helpful assistant."
QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def conversations(rng, texts, system_ok, specials):
    """Conversations for one template: user/assistant turns alternating, user
    first, with an optional system message first where the template has one."""
    hard = [t for t in tf.hard_cases(specials) if len(t) < 3000]
    pool = hard + texts
    edge = ["  padded with spaces  ", "\n\nnewlines first", "trailing newline\n", "", " ", "\t tab \t",
            "ends with a special " + specials[0], "mid " + specials[1] + " text"]
    out = []
    for k in range(48):
        turns = 1 + k % 4
        messages = []
        if system_ok and k % 3 == 0:
            messages.append({"role": "system", "content": rng.choice(pool + edge)})
        for t in range(turns):
            messages.append({"role": "user", "content": rng.choice(pool + edge)})
            if t < turns - 1 or k % 5 != 4:  # some conversations end on a user turn
                messages.append({"role": "assistant", "content": rng.choice(pool + edge)})
        out.append(messages)
    return out


def main():
    out = sys.argv[1]
    texts = tf.training_text()
    rng = random.Random(7)
    sample = [t[:400] for t in rng.sample(texts, 300)]
    bytelevel, bl_specials = tf.bytelevel(texts)
    sentencepiece, sp_specials = tf.sentencepiece(texts)
    metaspace, _ = tf.metaspace(texts)

    def with_tokens(tok, tokens):
        tok = tf.Tokenizer.from_str(tok.to_str())
        tok.add_special_tokens(tokens)
        return tok

    llama3_tok = with_tokens(bytelevel, ["<|start_header_id|>", "<|end_header_id|>"])
    chatml_tok = with_tokens(bytelevel, ["<|im_start|>", "<|im_end|>"])
    cases = [
        # name, tokenizer, bos, eos, own template, marked template, system allowed, template in .jinja
        ("llama3", llama3_tok, "<|begin_of_text|>", "<|eot_id|>", LLAMA3, LLAMA3_MARKED, True, False),
        ("chatml", chatml_tok, None, "<|im_end|>", *chatml(""), True, False),
        ("qwen2", chatml_tok, None, "<|im_end|>", *chatml(QWEN2_SYSTEM), True, False),
        ("qwen2.5", chatml_tok, None, "<|im_end|>", *chatml(QWEN25_SYSTEM), True, True),
        ("mistral", metaspace, "<s>", "</s>", *mistral(False), False, False),
        ("mistral-v0.1", metaspace, "<s>", "</s>", *mistral(True), False, False),
        ("llama2", sentencepiece, "<s>", "</s>", LLAMA2, LLAMA2_MARKED, True, False),
    ]
    for name, tok, bos, eos, own, marked, system_ok, jinja_file in cases:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
        config = {"bos_token": bos, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
        if jinja_file:
            with open(os.path.join(d, "chat_template.jinja"), "w") as f:
                f.write(own)
        else:
            config["chat_template"] = own
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
        specials = [s for s in ("<|eot_id|>", "<|im_end|>", "</s>", "<s>") if tok.token_to_id(s) is not None]
        specials += ["<s>", "</s>"]
        convs = conversations(random.Random(zlib.crc32(name.encode())), sample, system_ok, specials)
        with open(os.path.join(d, "chats.jsonl"), "w") as c, open(os.path.join(d, "expected.jsonl"), "w") as e:
            for messages in convs:
                text_own = hf.apply_chat_template(messages, chat_template=own, tokenize=False)
                text_marked = hf.apply_chat_template(messages, chat_template=marked, tokenize=False)
                assert text_own == text_marked, (name, messages, text_own, text_marked)
                enc = hf.apply_chat_template(messages, chat_template=marked, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
                ids, mask = enc["input_ids"], enc["assistant_masks"]
                if ids and isinstance(ids[0], list):
                    ids, mask = ids[0], mask[0]
                assert ids == hf(text_own, add_special_tokens=False)["input_ids"]
                c.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
                e.write(json.dumps({"input_ids": ids, "assistant_masks": list(mask)}) + "\n")
        print(name, "conversations", len(convs), "transformers", transformers.__version__)


if __name__ == "__main__":
    main()
