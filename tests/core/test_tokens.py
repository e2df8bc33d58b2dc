from attnscope.core.tokens import display_label


def test_byte_level_markers():
    assert display_label("Ġcat") == " cat"
    assert display_label("Ċ") == "↵"
    assert display_label("ĊĊ") == "↵↵"
    assert display_label("▁the") == " the"
    assert display_label("<|im_start|>") == "<|im_start|>"
    assert display_label("ĉ") == "⇥"


def test_smol_tokens_keep_raw_and_id(smol_ran):
    toks = smol_ran.tokens
    assert [t.position for t in toks] == list(range(len(toks)))
    quick = [t for t in toks if t.text == " quick"][0]
    assert quick.raw == "Ġquick"
    assert smol_ran.tokenizer.convert_ids_to_tokens(quick.id) == "Ġquick"
