"""The templates' model choices and file notes: every LingBot loader names a release's own layout (a folder the pack
downloads from the model's hub repository when its `download` switch is on, and converts once on the first load),
so a new user needs no terminal. Used by tools/update_templates.py."""
from __future__ import annotations

RELEASE_OF = {  # old choices -> the release's layout
    "lingbot-world-base-cam-nf4/high_noise_model_bnb_nf4": "lingbot-world-base-cam/high_noise_model",
    "lingbot-world-base-cam-nf4/low_noise_model_bnb_nf4": "lingbot-world-base-cam/low_noise_model",
    "lingbot-world-base-act/high_noise_model_bnb_nf4": "lingbot-world-base-act/high_noise_model",
    "lingbot-world-base-act/low_noise_model_bnb_nf4": "lingbot-world-base-act/low_noise_model",
}
T5 = "models_t5_umt5-xxl-enc-bf16.pth"
VAE = "Wan2.1_VAE.pth"

DOWNLOAD_NOTE = (
    "**Files**: nothing to copy by hand. Press Run: a loader whose model is not installed stops the run and says "
    "what it is, where it comes from and its licence. Turn on its **download** switch and press Run again: the pack "
    "fetches only that model's files from its Hugging Face repository into **ComfyUI/models/lingbot_world/{release}/** "
    "(progress on the node; a stopped download resumes; huggingface_hub's token, cache and HF_ENDPOINT mirror "
    "apply). {convert}")
CONVERT_NOTE = ("On the first load the release's float folder is written once as its NF4 copy beside it "
                "({copy}); later loads read the copy, and the loader says which it read.")


def release_of(ui: dict) -> str:
    """The release whose umT5 and VAE files a template's LingBot loaders read."""
    for node in ui["nodes"]:
        for value in node.get("widgets_values") or []:
            if isinstance(value, str) and value.startswith("lingbot-world-base-act/"):
                return "lingbot-world-base-act"
    return "lingbot-world-base-cam"


def use_release_files(ui: dict, set_widget, get_widget) -> None:
    """Experts -> the release's folders; LingBot Text Encode / VAE Loader -> the release's umT5 and VAE files (the
    core CLIPLoader / VAELoader keep ComfyUI's repackaged files, which the Missing Models dialog downloads)."""
    for node in ui["nodes"]:
        widgets = {"LingBotExpertLoader": ("high_noise_expert", "low_noise_expert"),
                   "LingBotModelLoader": ("expert",)}.get(node["type"], ())
        for widget in widgets:
            value = get_widget(node, widget)
            set_widget(node, widget, RELEASE_OF.get(value, value))
    release = release_of(ui)
    for node in ui["nodes"]:
        if node["type"] == "LingBotTextEncode" and not get_widget(node, "text_encoder").startswith("lingbot-demo"):
            set_widget(node, "text_encoder", f"{release}/{T5}")
            set_widget(node, "tokenizer", "auto")
        if node["type"] == "LingBotVAELoader" and not get_widget(node, "vae_name").startswith("lingbot-demo"):
            set_widget(node, "vae_name", f"{release}/{VAE}")


def files_note(release: str, copy: str) -> str:
    return DOWNLOAD_NOTE.format(release=release, convert=CONVERT_NOTE.format(copy=copy))


NOTES = {
    "Image to video, camera preset": (
        "## LingBot-World Base (Cam): image to video with a camera preset\n\n"
        + files_note("lingbot-world-base-cam", "high_noise_model_bnb_nf4/, low_noise_model_bnb_nf4/, 9.6 GB each") +
        "\n\nThe experts (high_noise_model/, low_noise_model/), the umT5 encoder with its tokenizer and the VAE all "
        "come from huggingface.co/robbyant/lingbot-world-base-cam (Apache-2.0). An NF4 folder you already have "
        "(e.g. cahlen/lingbot-world-base-cam-nf4) can be picked in the loader instead.\n\nAbout 20 GB of GPU memory "
        "for 480p x 81 frames with memory_mode auto; swap / block_swap for smaller GPUs. The first frame is the "
        "release's example 00, copied to ComfyUI/input/lingbot_examples/ when ComfyUI starts; pick any image "
        "instead."),
    "Image to video, recorded trajectory": (
        "## LingBot-World Base (Cam): a recorded camera path\n\n"
        + files_note("lingbot-world-base-cam", "high_noise_model_bnb_nf4/, low_noise_model_bnb_nf4/") +
        "\n\nThe files come from huggingface.co/robbyant/lingbot-world-base-cam (Apache-2.0).\n\n**Camera "
        "trajectory**: LingBot Camera From Files lists the folders under ComfyUI/input that hold poses.npy + "
        "intrinsics.npy (LingBot's action_path layout); the pack installs the release's example 00 there, or "
        "upload the two files on the node."),
    "Act model steered with keys": (
        "## Steer the Act model with keys (LingBot-World Base Act)\n\n"
        + files_note("lingbot-world-base-act", "high_noise_model_bnb_nf4/, low_noise_model_bnb_nf4/") +
        "\n\nThe Act release (huggingface.co/robbyant/lingbot-world-base-act, Apache-2.0) has the same folder names "
        "as the Cam release; the pack tells them apart from the weights (the Act control layer takes 7 channels).\n\n"
        "**Keys**: the pack installs the release's example 05 into ComfyUI/input/lingbot_examples/05/. With "
        "key_files on that folder, LingBot Actions feeds the Act model the release's own input; pick (action "
        "string) to steer with a string instead (e.g. w-10,a-10,iw-15,none-10). 20 steps, as the Act release "
        "recommends."),
    "Fast image to video, camera preset": (
        "## LingBot-World Fast: image to video with a camera preset\n\n"
        + files_note("lingbot-world-base-cam/lingbot_world_fast", "lingbot_world_fast_bnb_nf4/, 9.6 GB, instead of "
                     "quantizing 74 GB on every load; weights fp8 / int8 make lingbot_world_fast_fp8/ or _int8/") +
        "\n\nThe Fast model comes from huggingface.co/robbyant/lingbot-world-fast (Apache-2.0), placed as the "
        "release does inside lingbot-world-base-cam/; its umT5 encoder, tokenizer and VAE come from "
        "robbyant/lingbot-world-base-cam.\n\n4 denoising steps per chunk of 12 video frames, no CFG: 81 frames are "
        "7 chunks. kv_cache auto keeps the K/V cache on the GPU when it fits, else in pinned RAM. The preview VAE "
        "shows every finished chunk (about 5 GB of VRAM at 480p; disconnect it on small cards)."),
    "Fast model steered with keys, continued": (
        "## LingBot-World Fast: walk with keys, then continue twice\n\n"
        + files_note("lingbot-world-base-cam/lingbot_world_fast", "lingbot_world_fast_bnb_nf4/") +
        "\n\n**Part 1**: LingBot Actions turns the keys `w-10,l-10` into a camera path; the Fast Sampler makes the "
        "first 21 frames. **Part 2 and 3**: each LingBot Fast Continue takes the state of the node before it and "
        "walks on with new keys: change the keys of the last step and queue again, only that step runs.\n\n"
        "**rule = continuable** on the Sampler: the three parts together are exactly one run of the concatenated "
        "keys. A state keeps the video's K/V cache in RAM (about 0.33 GB per latent frame at 480p)."),
    "Image to video with native KSamplers, camera preset": (
        "## Native KSamplers on LingBot-World experts\n\n"
        + files_note("lingbot-world-base-cam", "high_noise_model_bnb_nf4/, low_noise_model_bnb_nf4/") +
        "\n\n**Text encoder / VAE** (core CLIPLoader, type wan, and Load VAE): umt5_xxl_fp8_e4m3fn_scaled."
        "safetensors and wan_2.1_vae.safetensors from Comfy-Org's repackaged Wan files; the Missing Models list "
        "downloads them into models/text_encoders and models/vae.\n\n**How it samples**: two KSamplerAdvanced like "
        "ComfyUI's Wan 2.2 template: the high-noise expert for steps 0-15 of 40, the low-noise one after."),
    "Image to video with native KSamplers and LoRA": (
        "## Native KSamplers with a LoRA per expert\n\n"
        + files_note("lingbot-world-base-cam", "high_noise_model_bnb_nf4/, low_noise_model_bnb_nf4/") +
        "\n\n**Text encoder / VAE** (core nodes): umt5_xxl_fp8_e4m3fn_scaled.safetensors and "
        "wan_2.1_vae.safetensors; the Missing Models list downloads them.\n\n**LoRA**: put a Wan 2.1/2.2 14B LoRA "
        "(.safetensors) in ComfyUI/models/loras/, pick it in the LingBot LoRA Loader of the expert it is for and "
        "turn the loader on (Ctrl+B)."),
}
