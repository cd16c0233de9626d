"""The VLM edge: processors, the tiny LLaVA of the miniature, local checkpoints, decoding.

The same code serves both scales: a processor (``AutoProcessor.from_pretrained(local_path)``
at paper scale, a ``LlavaProcessor`` built from a word-level tokenizer and a CLIP image
processor in the miniature) renders the chat template, expands the image tokens and returns the
vision inputs; ``PromptEncoder`` adds the mode tokens, fixes the template's awkward cases (its
own BOS, a ``<think>`` it injects into the generation prompt) and marks the response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoModelForImageTextToText,
    AutoProcessor,
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

from dual_dgo.miniature import (
    ANSWER_TAG,
    CELL,
    END_THINK,
    IMAGE_SIZE,
    MODE_TOKENS,
    SOURCE_TAGS,
)

MINI_SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]
MINI_WORDS = [*MODE_TOKENS.values(), END_THINK, ANSWER_TAG, *map(str, range(10)), "sum", "?", "=>"]
MINI_WORDS += list(SOURCE_TAGS)  # appended: the earlier words keep their ids
MINI_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image> {% else %}{{ part['text'] }} {% endif %}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}=> {% endif %}"
)


def build_mini_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the miniature's vocabulary; like Llama's, it adds a BOS."""
    vocab = {token: index for index, token in enumerate(MINI_SPECIAL + MINI_WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": "<image>"},
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tokenizer


def build_mini_processor() -> LlavaProcessor:
    """LlavaProcessor for 36x36 images, patch 12: 9 image tokens (the CLS token is dropped)."""
    images = CLIPImageProcessor(
        do_resize=True,
        size={"shortest_edge": IMAGE_SIZE},
        do_center_crop=True,
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_rescale=True,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=build_mini_tokenizer(),
        patch_size=CELL,
        vision_feature_select_strategy="default",
        chat_template=MINI_TEMPLATE,
        num_additional_image_tokens=1,
    )


def build_tiny_vlm(
    tokenizer: PreTrainedTokenizerFast, hidden: int, layers: int, heads: int, vision_hidden: int
) -> LlavaForConditionalGeneration:
    """A LLaVA of the real class: a CLIP vision tower (one patch per grid cell) and a Llama."""
    vision = CLIPVisionConfig(
        hidden_size=vision_hidden,
        intermediate_size=2 * vision_hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=CELL,
        # at CLIP's default init the patch content is a tiny perturbation of the position
        # embedding, and the language model never learned to read it (pilots)
        initializer_factor=5.0,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=(IMAGE_SIZE // CELL) ** 2,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    model = LlavaForConditionalGeneration(config)
    # LLaVA reads the last hidden state, never CLIP's pooled output: its final layer norm gets
    # no gradient, which DDP would refuse
    model.model.vision_tower.post_layernorm.requires_grad_(False)
    return model


class CheckpointNotFoundError(FileNotFoundError):
    """A local checkpoint folder is missing or incomplete; the message says what to put where."""

    user_facing = True


def load_local(path: str | Path, dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """A VLM and its processor from a local folder (never the hub, never remote code)."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise CheckpointNotFoundError(
            f"no checkpoint at {path}: expected config.json, the weights and the processor files "
            "(save_pretrained of a Qwen2.5-VL-class model and its AutoProcessor)"
        )
    processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True, dtype=dtype)
    return model, processor


def to_image(value: Any) -> Image.Image:
    """A PIL RGB image from an array in [0, 1] (HW or HWC) or a PIL image."""
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    array = np.asarray(value)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0, 1) * 255).round().astype(np.uint8)
    return Image.fromarray(array).convert("RGB")


@dataclass
class EncodedPrompt:
    input_ids: torch.Tensor  # [T] prompt ids, image tokens expanded
    vision: dict[str, torch.Tensor]  # pixel_values (and image_grid_thw for Qwen-VL)


class PromptEncoder:
    """Prompt and response token ids for one processor, with the mode tokens in its vocabulary.

    ``added_tokens`` counts the mode tokens this encoder had to add (resize the embeddings).
    """

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        missing = [
            t for t in (*MODE_TOKENS.values(), END_THINK) if t not in self.tokenizer.get_vocab()
        ]
        self.added_tokens = (
            self.tokenizer.add_tokens(missing, special_tokens=True) if missing else 0
        )
        self.fast_id = self.tokenizer.convert_tokens_to_ids(MODE_TOKENS["fast"])
        self.slow_id = self.tokenizer.convert_tokens_to_ids(MODE_TOKENS["slow"])
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        )

    def prompt_text(self, question: str) -> str:
        """The chat template's generation prompt for one image and the question.

        A template that injects its own ``<think>`` block into the generation prompt (Qwen3's
        non-thinking mode does) is cut before it: the first response token must be the mode
        token the model chooses.
        """
        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}
        ]
        text = self.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        cut = text.rfind(MODE_TOKENS["slow"])
        if cut > text.rfind(question):
            text = text[:cut]
        return text

    def encode_prompt(self, image: Any, question: str) -> EncodedPrompt:
        text = self.prompt_text(question)
        bos = self.tokenizer.bos_token
        # the template may already write the BOS that the tokenizer would add again
        add_special = not (bos is not None and text.startswith(bos))
        out = self.processor(
            text=[text],
            images=[to_image(image)],
            return_tensors="pt",
            add_special_tokens=add_special,
        )
        vision = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
        vision.pop("mm_token_type_ids", None)  # rebuilt per batch (Qwen-VL needs it)
        return EncodedPrompt(out["input_ids"][0], vision)

    def encode_response(self, text: str) -> torch.Tensor:
        """Response ids: the text (mode token first) and the EOS."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids or ids[0] not in (self.fast_id, self.slow_id):
            raise ValueError(f"a response must start with a mode token, got {text[:40]!r}")
        return torch.tensor([*ids, self.eos_id])

    def count_tokens(self, text: str) -> int:
        """Generated tokens of a response text: its tokens plus the EOS."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + 1


def batch_sequences(
    prompts: list[EncodedPrompt], responses: list[torch.Tensor], pad_id: int, image_token_id: int
) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response sequences with the response mask and the vision inputs."""
    sequences = [torch.cat([p.input_ids, r]) for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    response_mask = torch.zeros_like(input_ids)
    for row, (prompt, sequence) in enumerate(zip(prompts, sequences, strict=True)):
        input_ids[row, : len(sequence)] = sequence
        attention[row, : len(sequence)] = 1
        response_mask[row, len(prompt.input_ids) : len(sequence)] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention, "response_mask": response_mask}
    batch.update(_vision_batch(prompts, input_ids, image_token_id))
    return batch


def _vision_batch(prompts: list[EncodedPrompt], input_ids: torch.Tensor, image_token_id: int):
    keys = prompts[0].vision.keys()
    vision = {key: torch.cat([p.vision[key] for p in prompts]) for key in keys}
    if "image_grid_thw" in vision:  # Qwen-VL marks its image tokens
        vision["mm_token_type_ids"] = (input_ids == image_token_id).long()
    return vision


@torch.no_grad()
def decode_responses(
    model: Any,
    encoder: PromptEncoder,
    prompts: list[EncodedPrompt],
    mode_id: int | None,
    max_new_tokens: int,
    image_token_id: int,
    temperature: float = 0.0,
) -> list[list[int]]:
    """Decoding after the prompt, forced to start with ``mode_id`` (None: the model's own first
    token): greedy at ``temperature`` 0, else sampled (torch's global generator). Returns the
    generated ids (mode token included, up to and with EOS)."""
    forced = [] if mode_id is None else [mode_id]
    starts = [torch.cat([p.input_ids, torch.tensor(forced, dtype=torch.long)]) for p in prompts]
    width = max(len(s) for s in starts)
    input_ids = torch.full((len(starts), width), encoder.pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, start in enumerate(starts):  # left padding for generation
        input_ids[row, width - len(start) :] = start
        attention[row, width - len(start) :] = 1
    device = next(model.parameters()).device
    inputs = {"input_ids": input_ids, "attention_mask": attention}
    inputs.update(_vision_batch(prompts, input_ids, image_token_id))
    inputs = {k: v.to(device) for k, v in inputs.items()}
    output = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        **({"temperature": temperature, "top_k": 0} if temperature > 0 else {}),
        eos_token_id=encoder.eos_id,
        pad_token_id=encoder.pad_id,
    )
    generated = []
    for row in output[:, width:].tolist():
        ids = forced + row
        if encoder.eos_id in ids:
            ids = ids[: ids.index(encoder.eos_id) + 1]
        generated.append(ids)
    return generated
