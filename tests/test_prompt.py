"""pixrl.pix.prompt (contract v3): scale disclosure above 1.6x only, derivable from model-visible inputs;
raster; API doc = sandbox whitelist; chat/vision forms; bad specs (foundation area)."""
import re
from types import SimpleNamespace

import numpy as np
import pytest

from pixrl.pix.geometry import API_REGISTRY, allowed_names
from pixrl.pix.prompt import (ANISOTROPY_THRESHOLD, SVG_DOC, SVG_REGISTRY, PromptSpec, anisotropy, api_doc, build_messages,
                          build_prompt, documented_calls, documented_names, raster, render_scale)
from pixrl.pix.tasks import load_split


@pytest.fixture(scope="module")
def train():
    return load_split("train")


def _visible(footprint, image=None):
    "A task reduced to what the model sees: the footprint and the image (no program, no target)."
    if image is None:
        image = np.zeros((64, 64), bool)
        image[20:40, 10:50] = True
    return SimpleNamespace(footprint_um=footprint, model_image=image)


def _parse(prompt):
    lines = prompt.splitlines()
    fp = next(l for l in lines if l.startswith("Footprint:"))
    W, H = (float(v) for v in re.match(r"Footprint: ([\d.]+) x ([\d.]+) um$", fp).groups())
    rows = [l for l in lines if l and set(l) <= {"#", "."}]
    scale = [l for l in lines if l.startswith("Scale:")]
    return W, H, rows, scale


def test_scale_line_only_above_threshold_and_derivable(train):
    n_scaled = 0
    for t in train:
        W, H, rows, scale = _parse(build_prompt(t))
        assert (W, H) == t.footprint_um and len(rows) == 16 and all(len(r) == 16 for r in rows)
        if anisotropy(t) <= ANISOTROPY_THRESHOLD:
            assert scale == [], t.id
        else:
            n_scaled += 1
            sx, sy = (float(v) for v in re.match(r"Scale: x ([\d.]+) um/char, y ([\d.]+) um/char$", scale[0]).groups())
            # derivable from the stated footprint and the raster the prompt shows, nothing else
            assert abs(sx - W / len(rows[0])) < 1e-4 and abs(sy - H / len(rows)) < 1e-4
    assert 0.4 < n_scaled / len(train) < 0.65


def test_threshold_boundary_and_model_visible_inputs_only():
    at, above = _visible((16.0, 10.0)), _visible((16.5, 10.0))
    assert anisotropy(at) == pytest.approx(1.6) and "Scale:" not in build_prompt(at)
    p = build_prompt(above)
    assert "Scale: x 1.0312 um/char, y 0.625 um/char" in p  # 16.5/16, 10/16
    tall = _visible((10.0, 40.0))
    assert anisotropy(tall) == 4.0 and render_scale(tall, PromptSpec(raster=8)) == (1.25, 5.0)
    assert render_scale(tall) == (10 / 64, 40 / 64)  # spec=None: the 64x64 model image
    assert render_scale(tall, PromptSpec(vision=True)) == (10 / 256, 40 / 256)


def test_vision_scale_is_per_attached_pixel():
    t = _visible((200.0, 25.0))
    msgs = build_messages(t, PromptSpec(vision=True))
    img, text = msgs[0]["content"][0]["image"], msgs[0]["content"][1]["text"]
    assert img.size == (256, 256) and img.mode == "L"
    n = int(re.search(r"Image \(attached\): (\d+)x\1 px", text).group(1))
    assert n == img.size[0] and f"Scale: x {200 / n:.4f}".rstrip("0") in text
    assert _parse(text)[2] == []  # no raster rows in the vision form


def test_text_messages_equal_prompt_and_prompt_is_deterministic(train):
    t = train[7]
    assert build_messages(t, PromptSpec())[0] == {"role": "user", "content": build_prompt(t)}
    assert build_prompt(t) == build_prompt(load_split("train")[7])


def test_api_doc_is_the_whitelist_and_can_be_dropped(train):
    assert documented_names() == allowed_names()
    t = train[0]
    full, tiny = build_prompt(t), build_prompt(t, PromptSpec(api_doc=False))
    assert api_doc() in full and api_doc() not in tiny and "rect(x, y, w, h)" not in tiny
    for p in (full, tiny):
        assert p.rstrip().endswith("Answer with one ```python block containing only the program.")
    assert len(tiny) < 600


def test_api_doc_is_rendered_from_the_registries():
    "One doc line per registry entry, in order, between header and footer; documented names/calls read the registries."
    for rep, registry in (("py", API_REGISTRY), ("svg", SVG_REGISTRY)):
        lines = api_doc(rep).splitlines()
        assert lines[1:-1] == [f"{e.signature}  # {e.doc}" for e in registry.values()]
        assert set(documented_calls(rep)) == set(registry) and set(registry) <= documented_names(rep)
    assert documented_calls()["path"] == ("points", "width")
    assert documented_calls("svg")["rect"] == ("x", "y", "width", "height")
    with pytest.raises(ValueError, match="svgx"):
        documented_names("svgx")


def test_svg_doc_text_is_unchanged_by_generating_it():
    "The rendered svg block is the contract-v3 text, byte for byte (a changed prompt changes model behaviour)."
    assert api_doc("svg") == SVG_DOC == (
        'SVG (units um; <svg viewBox="0 0 W H"> is the footprint; y grows DOWN from the top edge):\n'
        '<rect x= y= width= height=/>  # filled rectangle, (x, y) = its top-left corner\n'
        '<circle cx= cy= r=/>  # filled disc; fill="none" stroke-width="w": a ring of width w\n'
        '<polygon points="x1,y1 x2,y2 x3,y3"/>  # filled polygon\n'
        '<path d="M x y L x y H x V y Z" stroke-width="w"/>  # wire of width w (commands M L H V Z)\n'
        'fill="white" removes material drawn before it; <g> groups. Nothing else.')


def test_raster_rules():
    img = np.zeros((64, 64), bool)
    img[62:64, 0:4] = True  # half of the bottom-left 4x4 block
    assert raster(img, 16)[-1] == "#" + "." * 15 and raster(img, 16, "majority")[-1] == "." * 16
    img[61, 0:4] = True  # 12 of 16
    assert raster(img, 16, "majority")[-1][0] == "#"
    assert raster(img, 4) == ["....", "....", "....", "#..."]
    assert "'#' = cell mostly ink" in build_prompt(_visible((5.0, 5.0), img), PromptSpec(raster_rule="majority"))


@pytest.mark.parametrize("kw,needle", [
    (dict(raster=10), "raster=10"), (dict(raster=0), "raster=0"), (dict(representation="svgx"), "'svgx'"),
    (dict(raster_rule="mean"), "'mean'"), (dict(image_size=100), "image_size=100"),
])
def test_bad_spec_named(kw, needle):
    with pytest.raises(ValueError) as e:
        PromptSpec(**kw)
    assert needle in str(e.value)


def test_build_prompt_refuses_vision_spec(train):
    with pytest.raises(ValueError, match="build_messages"):
        build_prompt(train[0], PromptSpec(vision=True))


def test_svg_doc_matches_the_evaluator_parser():
    "Every construct the svg doc names means what the doc says, through the evaluator's parser."
    import pixrl.pix.evaluator as E
    from pixrl.pix.geometry import render
    from pixrl.pix.prompt import REPRESENTATIONS
    assert set(REPRESENTATIONS) == set(E.REPRESENTATIONS)
    fp, shape = (20.0, 10.0), (64, 128)
    svg = ('<svg viewBox="0 0 20 10"><rect x="2" y="1" width="4" height="3"/>'
           '<circle cx="12" cy="5" r="3" fill="none" stroke-width="1"/>'
           '<polygon points="15,9 19,9 17,6"/><path d="M 1 8 H 8 V 6" stroke-width="1"/>'
           '<rect x="3" y="2" width="1" height="1" fill="white"/></svg>')
    py = ("rect(2, 6, 4, 3)\nring(12, 5, 3, 1)\npolygon([(15, 1), (19, 1), (17, 4)])\n"
          "path([(1, 2), (8, 2), (8, 4)], 1)\ncut(rect(3, 7, 1, 1))\n")
    assert E.check_source(svg, "svg") is None
    assert np.array_equal(render(E.svg_to_program(svg, fp), fp, shape), render(py, fp, shape))
    spec = PromptSpec(representation="svg", api_doc=True)
    p = build_prompt(_visible(fp), spec)
    assert api_doc("svg") in p and "```svg" in p and "rect(x, y, w, h)" not in p


def test_runs_scale_line_names_cells():
    "The runs format counts cells, not characters: its scale line says um/cell, derivable from footprint / n."
    tall = _visible((10.0, 40.0))
    p = build_prompt(tall, PromptSpec(raster=32, raster_format="runs"))
    assert "Scale: x 0.3125 um/cell, y 1.25 um/cell" in p  # 10/32, 40/32
    assert "um/char" in build_prompt(tall, PromptSpec(raster=32))
