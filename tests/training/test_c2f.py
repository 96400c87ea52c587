import numpy as np
import pytest
import torch

from edgecap.cider import CiderD
from edgecap.models import build_model
from edgecap.training.c2f import c2f_loss, self_critical_objective, stage_advantages
from edgecap.training.scst import leave_one_out_mean, sample_captions, scst_loss
from edgecap.vocab import EOS, PAD, Vocab

WORDS = "a red blue circle square on the left right".split()
REFERENCES = {"0": [["a", "red", "circle"], ["the", "red", "circle"]],
              "1": [["a", "blue", "square"], ["the", "blue", "square"]]}


def _model(fine_stages=2, seed=0):
    torch.manual_seed(seed)
    vocab = Vocab(("<pad>", "<bos>", "<eos>", "<unk>", *WORDS))
    model = build_model("stackcap", {"vocab_size": len(vocab), "feature_dim": 8, "num_locations": 4,
                                     "annotation_dim": 0, "embed_dim": 16, "hidden_dim": 32, "att_dim": 16,
                                     "dropout": 0.0, "fine_stages": fine_stages})
    features = torch.zeros(2, 4, 8)
    features[0, :, 0], features[1, :, 1] = 1.0, 1.0
    return model, vocab, features


def test_every_stage_samples_its_own_caption_and_ends_with_the_last_stage():
    model, _, features = _model()
    tokens, logprobs, mask = sample_captions(model, features, samples=3, max_length=6, stages=True)
    assert tokens.shape[:2] == (3, 6) and tokens.shape == logprobs.shape == mask.shape
    assert (mask.sum(-1) <= mask[-1].sum(-1)).all()  # no stage outlives the caption that is fed back
    for stage_tokens, stage_mask in zip(tokens, mask, strict=True):
        for row, row_mask in zip(stage_tokens.tolist(), stage_mask.tolist(), strict=True):
            count = sum(row_mask)
            assert all(row_mask[:count]) and all(t == PAD for t in row[count:])
            assert EOS not in row[: count - 1]


def test_greedy_last_stage_is_the_greedy_inference_caption():
    model, _, features = _model()
    model.eval()
    with torch.no_grad():
        staged, _, _ = sample_captions(model, features, samples=1, max_length=6, greedy=True, stages=True)
        plain, _, _ = sample_captions(model, features, samples=1, max_length=6, greedy=True)
    assert torch.equal(staged[-1], plain)


def test_advantages_reward_beating_the_greedy_decode_and_the_previous_stage():
    cider = CiderD(REFERENCES)
    captions = {"coarse": ["a", "circle"], "fine": ["a", "red", "circle"], "greedy": ["a", "blue", "square"]}
    r = {k: float(cider.score(["0"], [v])[0]) for k, v in captions.items()}
    assert r["fine"] > r["coarse"] > r["greedy"]
    # One sample row; stage 2 improves on stage 1, stage 3 falls back to stage 1's caption and to its greedy one.
    rewards = np.array([[r["coarse"]], [r["fine"]], [r["coarse"]]])
    greedy = np.array([[r["greedy"]], [r["greedy"]], [r["coarse"]]])
    advantage = stage_advantages(rewards, greedy)
    np.testing.assert_allclose(advantage[:, 0], [r["coarse"] - r["greedy"],
                                                 (r["fine"] - r["greedy"]) + (r["fine"] - r["coarse"]),
                                                 r["coarse"] - r["fine"]])
    assert advantage[0, 0] > 0 and advantage[1, 0] > advantage[0, 0] and advantage[2, 0] < 0


@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_c2f_loss_is_finite_and_reaches_every_stage_output_layer(baseline):
    model, vocab, features = _model(fine_stages=2)
    model.train()
    torch.manual_seed(1)
    loss, reward = c2f_loss(model, features, ["0", "1"], cider=CiderD(REFERENCES), vocab=vocab, samples=4,
                            max_length=4, baseline=baseline)
    assert loss.dim() == 0 and torch.isfinite(loss) and np.isfinite(reward)
    loss.backward()
    for out in model.out:
        assert out.weight.grad is not None and out.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_coarse_to_fine_training_raises_the_last_stage_reward(baseline):
    model, vocab, features = _model()
    cider = CiderD(REFERENCES)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    torch.manual_seed(1)
    rewards = []
    for _ in range(40):
        loss, reward = c2f_loss(model, features, ["0", "1"], cider=cider, vocab=vocab, samples=8, max_length=4,
                                baseline=baseline)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rewards.append(reward)
    assert np.mean(rewards[-20:]) > np.mean(rewards[:10]) + 0.5


def test_the_mean_baseline_leaves_each_image_only_the_inter_stage_term():
    rewards = np.array([[0.2, 0.4, 0.9, 0.1, 0.1, 0.4],  # stage 1: image A's 3 samples, then image B's
                        [0.3, 0.6, 0.9, 0.2, 0.0, 0.7]])  # stage 2
    baselines = leave_one_out_mean(rewards.reshape(2, 2, 3)).reshape(2, 6)
    np.testing.assert_allclose(baselines[0, :3], [0.65, 0.55, 0.3])
    advantage = stage_advantages(rewards, baselines).reshape(2, 2, 3)
    np.testing.assert_allclose(advantage[0].sum(-1), 0, atol=1e-12)
    np.testing.assert_allclose(advantage[1].sum(-1), (rewards[1] - rewards[0]).reshape(2, 3).sum(-1))


@pytest.mark.parametrize(("model_id", "objective", "loss"), [
    ("stackcap", "auto", c2f_loss), ("stackcap", "c2f", c2f_loss), ("stackcap", "scst", scst_loss),
    ("sat", "auto", scst_loss), ("sat", "scst", scst_loss)])
def test_scst_objective_picks_the_self_critical_loss(model_id, objective, loss):
    assert self_critical_objective(model_id, objective) is loss


def test_plain_self_critical_training_of_stack_captioning_rewards_only_its_last_stage():
    model, vocab, features = _model(fine_stages=2)
    model.train()
    torch.manual_seed(1)
    loss, _ = scst_loss(model, features, ["0", "1"], cider=CiderD(REFERENCES), vocab=vocab, samples=4, max_length=4,
                        baseline="mean")
    loss.backward()
    assert model.out[-1].weight.grad.abs().sum() > 0
    assert all(out.weight.grad is None or not out.weight.grad.any() for out in model.out[:-1])


def test_c2f_on_a_single_stage_decoder_is_refused_in_one_line():
    from edgecap.config import SCSTConfig
    from edgecap.errors import EdgecapError, ModelError
    from edgecap.training.runs import resolve_run

    with pytest.raises(ModelError, match="scst.objective=c2f rewards every stage .* sat has one"):
        resolve_run("sat", "shapes", "tiny", ["scst.objective=c2f"])
    assert resolve_run("stackcap", "shapes", "tiny", ["scst.objective=scst"]).train.scst.objective == "scst"
    with pytest.raises(EdgecapError, match="scst.objective must be one of auto, scst, c2f"):
        SCSTConfig(objective="ppo")
