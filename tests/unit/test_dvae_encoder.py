"""The exported DVAE encoder against ChatTTS' ``DVAE.sample_audio``: the mel bit for bit,
the codes exactly, on many recordings and at the length boundaries, except a code whose
``floor`` input lies within float noise of a level boundary (which side it falls on depends on
the CPU's kernels: tests/support/chattts_ref.py); the artifact manifest; the runner's errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from chattts_serving import contract
from chattts_serving.audio.encoder import DvaeEncoderRunner
from chattts_serving.export.build import ENCODER_MISMATCH_TOLERANCE, EXPORTER_VERSION, check_encoder_parity
from chattts_serving.export.parity import encoder_parity_audio
from chattts_serving.export.weights import WeightsError
from chattts_serving.runtime import Artifacts
from tests.support.chattts_ref import assert_same_codes, sample_audio_with_knife_edges

SR = contract.SAMPLE_RATE_HZ
BOUNDARY_LENGTHS = (513, 514, 767, 768, 1023, 1024, 1279, 1280, 24000, 24001)


def _recordings(chat) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Noise, chirps, a random walk (little high-frequency energy: small mel values) and
    speech-like audio decoded by the checkpoint's own DVAE + Vocos, of several lengths."""
    rng = np.random.default_rng(21)
    out = [rng.normal(0, 0.1, n).astype(np.float32) for n in BOUNDARY_LENGTHS]
    for i in range(4):
        n = int(rng.integers(SR, 6 * SR))
        t = np.arange(n) / SR
        out.append((0.3 * np.sin(2 * np.pi * (80 + 400 * i * t) * t) + rng.normal(0, 0.01, n)).astype(np.float32))
        walk = np.cumsum(rng.normal(0, 0.01, n))
        out.append((0.5 * walk / np.abs(walk).max()).astype(np.float32))
    g = torch.Generator().manual_seed(8)
    for tokens in (30, 200):
        codes = torch.randint(0, 625, (1, contract.NUM_VQ, tokens), generator=g, dtype=torch.int32)
        with torch.no_grad():
            out.append(chat.vocos.decode(chat.dvae(codes)).numpy()[0].astype(np.float32))
    out.append(np.zeros(SR, np.float32))  # silence: every mel bin at the 1e-5 floor
    return out


def test_log_mel_is_bit_identical_to_chattts(small_chat, small_artifacts: Artifacts) -> None:
    runner = DvaeEncoderRunner(small_artifacts)
    for wav in _recordings(small_chat)[:12]:
        ref = small_chat.dvae.preprocessor_mel(torch.from_numpy(wav.copy())).numpy()
        got = runner.mel(wav)
        assert got.shape == ref.shape == (contract.N_MELS, wav.size // contract.HOP_SAMPLES + 1)
        np.testing.assert_array_equal(got, ref)


def test_codes_equal_chattts_sample_audio_exactly_but_at_knife_edge_floors(small_chat,
                                                                         small_artifacts: Artifacts) -> None:
    """Every code equals ChatTTS', except the few decided within float noise of a level boundary
    (none differ here; but some features lie 1.1e-5 from one, and torch's AVX2 and AVX-512
    kernels alone compute them up to 1.7e-5 apart)."""
    runner = DvaeEncoderRunner(small_artifacts)
    compared = excused = 0
    for wav in _recordings(small_chat):
        ref, near = sample_audio_with_knife_edges(small_chat, wav)  # (4, T) int32, (4, T) bool
        got = runner.run(wav)
        assert got.dtype == np.int32 and got.shape == (contract.encoder_tokens(wav.size), contract.NUM_VQ)
        excused += assert_same_codes(got, ref, near)
        assert got.min() >= 0 and got.max() < contract.EOS_CODE
        compared += got.size
    assert compared > 3000 and excused <= compared // 200, (compared, excused)


def test_manifest_lists_the_encoder_and_its_parity(small_chat, small_artifacts: Artifacts) -> None:  # type: ignore[no-untyped-def]
    man = small_artifacts.manifest
    assert man["exporter_version"] == EXPORTER_VERSION >= 4
    io = man["graphs"]["dvae_encoder"]
    assert io["file"] == contract.DVAE_ENCODER_GRAPH
    assert [i["name"] for i in io["inputs"]] == [contract.E_MEL]
    assert io["inputs"][0]["shape"][1] == contract.N_MELS
    assert [o["name"] for o in io["outputs"]] == [contract.E_CODES] and io["outputs"][0]["dtype"] == "int32"
    assert {contract.DVAE_ENCODER_GRAPH, contract.MEL_FILE} <= set(man["files"])
    parity = man["encoder_parity"]
    # 0 differing codes, but for those decided within float noise of a level boundary (usually none)
    knife_edges = sum(int(sample_audio_with_knife_edges(small_chat, w)[1].sum())
                      for w in encoder_parity_audio(small_chat))
    assert parity["mismatched_codes"] <= knife_edges and parity["length_mismatches"] == 0 and parity["codes"] > 1000
    check_encoder_parity(parity)  # the export's own gate passes what it recorded


def _report(codes: float = 4000, bad: float = 0, lengths: float = 0) -> dict[str, float]:
    return {"codes": codes, "mismatched_codes": bad, "mismatch_fraction": bad / max(codes, 1),
            "length_mismatches": lengths}


def test_the_export_gate_fails_on_any_length_mismatch_and_on_too_many_differing_codes() -> None:
    check_encoder_parity(_report())
    check_encoder_parity(_report(bad=3))  # under the tolerance: a rare level-boundary case
    with pytest.raises(WeightsError, match=r"different number of tokens .* for 1 parity recording"):
        check_encoder_parity(_report(lengths=1))  # even with every compared code equal
    with pytest.raises(WeightsError, match="different number of tokens"):
        check_encoder_parity(_report(codes=0, lengths=2))  # every recording's length wrong: nothing compared
    with pytest.raises(WeightsError, match="compared no codes"):
        check_encoder_parity(_report(codes=0))
    bad = int(4000 * ENCODER_MISMATCH_TOLERANCE) + 1
    with pytest.raises(WeightsError, match=f"in {bad} of 4000 codes"):
        check_encoder_parity(_report(bad=bad))


def test_runner_refuses_what_the_encoder_cannot_take(small_artifacts: Artifacts, tmp_path: Path) -> None:
    runner = DvaeEncoderRunner(small_artifacts)
    assert contract.encoder_tokens(contract.ENCODER_MIN_SAMPLES - 1) == 0
    for bad, what in [(np.zeros(contract.ENCODER_MIN_SAMPLES - 1, np.float32), "at least"),
                      (np.zeros((2, SR), np.float32), "1-D"), (np.full(SR, np.inf, np.float32), "infinite")]:
        with pytest.raises(ValueError, match=what):
            runner.run(bad)
    with pytest.raises(FileNotFoundError, match="re-run"):
        DvaeEncoderRunner(Artifacts(tmp_path, {}))
