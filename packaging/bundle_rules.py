"""What the frozen AttnScope bundle leaves out: rules shared by attnscope.spec and its tests.

Sizes quoted are of the Linux x86-64 build (torch 2.13 CPU, PySide6 6.12, transformers 5.x).
"""

from __future__ import annotations

import re
from pathlib import Path

# -- transformers model code ---------------------------------------------------------------------
# Per family, only these file kinds are dropped: a family's configuration_*/tokenization_* and its
# __init__ stay for every family (8 MB of source), because AutoTokenizer imports whichever family
# first names a tokenizer class (transformers.models.auto.tokenization_auto.tokenizer_class_from_name)
# and AutoConfig may parse any config.json. Model code is 25 MB of source (+ bytecode).
HEAVY_PREFIXES = (
    "modeling_",
    "modular_",
    "convert_",
    "image_processing_",
    "video_processing_",
    "processing_",
    "feature_extraction_",
    "generation_",
)
NEVER_AT_RUNTIME = ("modular_", "convert_")  # generator inputs and conversion scripts


def kept_families(models_dir: Path, model_types) -> set[str]:
    """transformers.models sub-packages whose model code stays: the families of ``model_types``,
    ``auto``, and every family their run-time code imports (``from ..X``), transitively."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    keep = {"auto"} | {model_type_to_module_name(t) for t in model_types}
    todo = sorted(keep)
    while todo:
        fam = todo.pop()
        for py in (models_dir / fam).glob("*.py"):
            if py.name.startswith(NEVER_AT_RUNTIME):
                continue
            for dep in re.findall(r"from \.\.(\w+)", py.read_text(encoding="utf-8")):
                if dep not in keep and (models_dir / dep).is_dir():
                    keep.add(dep)
                    todo.append(dep)
    return keep


def transformers_excludes(model_types) -> tuple[list[str], set[str]]:
    """Module names to exclude from the bundle, and the kept families (see :func:`kept_families`)."""
    import transformers

    models_dir = Path(transformers.__file__).parent / "models"
    keep = kept_families(models_dir, model_types)
    out = []
    for fam_dir in sorted(models_dir.iterdir()):
        if not fam_dir.is_dir() or fam_dir.name == "__pycache__":
            continue
        kept = fam_dir.name in keep
        for py in sorted(fam_dir.glob("*.py")):
            if py.name.startswith(NEVER_AT_RUNTIME if kept else HEAVY_PREFIXES):
                out.append(f"transformers.models.{fam_dir.name}.{py.stem}")
        if not kept:
            for sub in sorted(fam_dir.iterdir()):  # model-code sub-packages (esm/openfold_utils)
                if sub.is_dir() and (sub / "__init__.py").is_file():
                    out.append(f"transformers.models.{fam_dir.name}.{sub.name}")
    return out, keep


# -- Python packages ------------------------------------------------------------------------------
EXCLUDED_PACKAGES = [
    # test and development tools
    "pytest",
    "_pytest",
    "hypothesis",
    "pytestqt",
    "IPython",
    "ipykernel",
    "jupyter_client",
    "notebook",
    "tkinter",
    "_tkinter",
    # optional dependencies of torch/transformers that the app never calls
    "matplotlib",
    "pandas",
    "scipy",
    "sklearn",
    "tensorboard",
    "torchvision",
    "torchaudio",
    "onnx",
    "onnxruntime",
    "cv2",
    "av",
    "librosa",
    "soundfile",
    "timm",
    "bitsandbytes",
    "deepspeed",
    "apex",
    "triton",
    "PyQt5",
    "PyQt6",
    "PySide2",
    "OpenGL",
    # the download/serving side of the hub libraries: the app opens local files only
    "hf_xet",
    "pydantic",
    "pydantic_core",
    "fsspec",
    "typer",
    "rich",
    "click",
    # attnscope serve --ray runs from a pip install on the cluster, never from the desktop bundle
    # (the bundle's serve --ray says "pip install ray"); CI's venv has Ray for its tests (~240 MB)
    "ray",
    "transformers.cli",
    "transformers.commands",
    "huggingface_hub.cli",
    "huggingface_hub.commands",
    # torch imports sympy (symbolic shapes), never these parts of it
    "sympy.physics",
    "sympy.stats",
    # Qt modules the app and pyqtgraph never import
    "PySide6.QtQml",
    "PySide6.QtQuick",
    "PySide6.QtQuickWidgets",
    "PySide6.QtNetwork",
    "PySide6.QtSql",
    "PySide6.QtDesigner",
    "PySide6.QtUiTools",
    "PySide6.QtPdf",
    "PySide6.QtPdfWidgets",
    "PySide6.QtDBus",
    "PySide6.QtHelp",
    "PySide6.QtXml",
    "PySide6.QtConcurrent",
]
# MP4 export (core/io/animation.py) uses imageio-ffmpeg when present, which ships a 165 MB ffmpeg
# binary; without it the app says so (attnscope.core.io.animation.mp4_unavailable: the MP4 item greyed out with the
# reason, the CLI one line) and offers GIF. ATTNSCOPE_WITH_MP4=1 bundles it (hook-imageio_ffmpeg).
MP4_PACKAGES = ["imageio", "imageio_ffmpeg"]

# -- files (destination paths inside the bundle, "/" separated) ----------------------------------------
DROP = [
    # torch: C++ headers, CMake files, test binaries and test libraries (torch_shm_manager stays:
    # torch.multiprocessing starts it)
    r"torch/include/",
    r"torch/test/",
    r"torch/share/cmake/",
    r"torch/utils/benchmark/",
    r"torch/bin/(?!torch_shm_manager$)",
    r"torch/lib/lib(jitbackend_test|torchbind_test|aoti_custom_ops|backend_with_compiler)\.",
    # GPU runtimes a build machine may have (this bundle is the CPU build)
    r"(^|/)lib(cuda|cudart|cudnn|cublas|cublasLt|cufft|curand|cusolver|cusparse|nccl|nvrtc|nvToolsExt|nvJitLink"
    r"|cupti|cusparseLt|cufile)[^/]*$",
    r"(^|/)nvidia/",
    r"(^|/)triton/",
    r"(^|/)lib(amdhip|rocm|hip|MIOpen)[^/]*$",
    # Qt: translations, QML, tools, and plugins of modules the app does not use. Qt's layout differs:
    # Linux PySide6/Qt/lib/libQt6X.so.6, Windows PySide6/Qt6X.dll, macOS PySide6/Qt/lib/QtX.framework/
    r"PySide6/(Qt/)?translations/",
    r"PySide6/(Qt/)?qml/",
    r"(^|/)(lib)?Qt6?(Quick|Qml|Pdf|Designer|Network|Sql|VirtualKeyboard|EglFSDeviceIntegration|EglFsKmsSupport)\w*"
    r"(\.so[.0-9]*$|\.dll$|\.framework/)",
    r"PySide6/(Qt/)?plugins/(qmltooling|sqldrivers|networkinformation|tls|designer|virtualkeyboard|position"
    r"|multimedia)/",
    r"PySide6/(Qt/)?plugins/platforminputcontexts/libqtvirtualkeyboard",
    # embedded-device platforms (framebuffer, EGLFS, VNC, evdev input) and the GTK theme plugin, with
    # what only the GTK plugin links: the app runs on X11 (xcb) and Wayland desktops
    r"PySide6/Qt/plugins/platforms/libq(eglfs|linuxfb|minimalegl|vkkhrdisplay|vnc)\.",
    r"PySide6/Qt/plugins/(egldeviceintegrations|generic)/",
    r"PySide6/Qt/plugins/platformthemes/libqgtk3",
    r"^lib(gtk-3|gdk-3|gdk_pixbuf-2\.0|atk-1\.0|atk-bridge-2\.0|atspi|cairo|cairo-gobject|pango-1\.0"
    r"|pangocairo-1\.0|pangoft2-1\.0|datrie|thai|fribidi|graphite2|harfbuzz|pixman-1|epoxy|jpeg"
    r"|gssapi_krb5|krb5|k5crypto|krb5support|com_err|keyutils)\.so[.0-9]*$",
    r"PySide6/(designer|assistant|linguist|lrelease|lupdate|qml\w*|uic|rcc|balsam\w*|svgtoqml)(\.exe)?$",
    r"PySide6/(include|typesystems|scripts|glue|examples|doc)/",
    r"\.pyi$",
    r"pyqtgraph/examples/",
    r"(^|/)__pycache__/",
]
# Libraries of the desktop the app runs on (X11/xcb, xkbcommon, fontconfig, freetype, GLib, D-Bus
# and what they link) come from the host on Linux, not the bundle: a bundled copy can clash with
# the host's configuration files and drivers (PyInstaller already leaves out GL/EGL/Wayland). The
# .deb lists their packages in Depends (check_bundle.py finds them). Hash-suffixed copies that
# Pillow ships privately (libxcb-9065bb12.so...) are not matched and stay.
HOST_LIBS = [
    r"^lib(X11|X11-xcb|Xau|Xdmcp|Xext|Xrender|xcb|xcb-(cursor|glx|icccm|image|keysyms|randr|render-util|render"
    r"|shape|shm|sync|util|xfixes|xkb|xinerama|xinput|present|dri2|dri3)|xkbcommon|xkbcommon-x11|fontconfig"
    r"|freetype|expat|dbus-1|systemd|glib-2\.0|gio-2\.0|gobject-2\.0|gmodule-2\.0|gthread-2\.0|pcre2-8|mount"
    r"|blkid|selinux|gcrypt|gpg-error|lz4|cap|bsd|md|png16)\.so[.0-9]*$",
]


def drop_pattern(linux: bool) -> re.Pattern:
    """One regex over bundle destination paths: a match is left out of the bundle."""
    return re.compile("|".join(f"(?:{p})" for p in DROP + (HOST_LIBS if linux else [])))


def keep_entry(pattern: re.Pattern, dest: str) -> bool:
    return not pattern.search(dest.replace("\\", "/"))
