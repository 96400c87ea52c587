import numpy as np
import pytest
import torch

from edgecap.cider import CiderD
from edgecap.models import MODELS, build_model
from edgecap.training.data import tokenised_references
from edgecap.training.scst import policy_samples, sample_captions, scst_loss, words_of
from edgecap.vocab import EOS, PAD, Vocab

WORDS = "a red blue circle square on the left right".split()
REFERENCES = {"0": [["a", "red", "circle"], ["the", "red", "circle"]],
              "1": [["a", "blue", "square"], ["the", "blue", "square"]]}


def _model(seed=0):
    torch.manual_seed(seed)
    vocab = Vocab(("<pad>", "<bos>", "<eos>", "<unk>", *WORDS))
    model = build_model("sat", {"vocab_size": len(vocab), "feature_dim": 8, "num_locations": 4, "annotation_dim": 0,
                                "embed_dim": 16, "hidden_dim": 32, "att_dim": 16, "dropout": 0.0})
    features = torch.zeros(2, 4, 8)
    features[0, :, 0], features[1, :, 1] = 1.0, 1.0
    return model, vocab, features


def test_samples_stop_at_eos_and_pad_after_it():
    model, _, features = _model()
    tokens, logprobs, mask = sample_captions(model, features, samples=3, max_length=6)
    assert tokens.shape[0] == 6 and tokens.shape == logprobs.shape == mask.shape
    for row, row_mask in zip(tokens.tolist(), mask.tolist(), strict=True):
        if EOS in row:
            end = row.index(EOS)
            assert all(row_mask[: end + 1]) and not any(row_mask[end + 1:])
            assert all(t == PAD for t in row[end + 1:])


def test_self_critical_training_raises_the_reward():
    model, vocab, features = _model()
    cider = CiderD(REFERENCES)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    torch.manual_seed(1)
    rewards = []
    for _ in range(60):
        loss, reward = scst_loss(model, features, ["0", "1"], cider=cider, vocab=vocab, samples=8, max_length=4,
                                 baseline="mean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rewards.append(reward)
    assert np.mean(rewards[-10:]) > np.mean(rewards[:10]) + 1.0
    model.eval()
    with torch.no_grad():
        greedy, _, _ = sample_captions(model, features, samples=1, max_length=4, greedy=True)
    first, second = words_of(greedy, vocab)
    assert {"red", "circle"} <= set(first) and {"blue", "square"} <= set(second)


def test_the_greedy_baseline_is_each_image_s_greedy_caption_reward():
    model, vocab, features = _model()
    with torch.no_grad():
        greedy = words_of(sample_captions(model.eval(), features, samples=1, max_length=4, greedy=True)[0], vocab)
    model.train()
    # References that hold the greedy captions, so their reward, the baseline, is far from zero; two more images keep
    # the greedy words out of some documents, or their idf would be zero.
    cider = CiderD({**{image: [greedy[i], *REFERENCES[image]] for i, image in enumerate(("0", "1"))},
                    "2": [["a", "red", "square"]], "3": [["the", "blue", "circle"]]})
    torch.manual_seed(3)
    loss, _ = scst_loss(model, features, ["0", "1"], cider=cider, vocab=vocab, samples=2, max_length=4,
                        baseline="greedy")
    torch.manual_seed(3)
    tokens, logprobs, mask = sample_captions(model, features, samples=2, max_length=4)
    rewards = cider.score(["0", "0", "1", "1"], words_of(tokens, vocab))
    baseline = cider.score(["0", "1"], greedy).repeat(2)
    assert baseline.min() > 0.5

    def policy_loss(base):
        advantage = torch.from_numpy((rewards - base).astype(np.float32))
        return -(advantage[:, None] * logprobs * mask.float()).sum() / mask.float().sum()

    torch.testing.assert_close(loss, policy_loss(baseline))
    assert not torch.allclose(loss, policy_loss(np.zeros_like(baseline)))


@pytest.mark.parametrize(("model_id", "options"), [("a2", {}), ("glied", {"attributes": 3})])
def test_transformers_score_their_samples_in_one_pass_with_the_step_loop_s_gradient(model_id, options):
    """The one-pass scoring of a Transformer's samples is the step loop's policy gradient, not an approximation."""
    torch.manual_seed(0)
    vocab = Vocab(("<pad>", "<bos>", "<eos>", "<unk>", *WORDS))
    model = build_model(model_id, {"vocab_size": len(vocab), "feature_dim": 8, "num_locations": 4,
                                   **MODELS[model_id].sizes["tiny"], **options, "dropout": 0.0}).eval()
    features = torch.randn(2, 4, 8)
    gradients = []
    for sample in (sample_captions, policy_samples):
        torch.manual_seed(5)
        tokens, logprobs, mask = sample(model, features, samples=3, max_length=6)
        model.zero_grad()
        (logprobs * mask).sum().backward()
        counted = (logprobs * mask).detach()  # past eos a row's log-prob is of a word it never outputs
        gradients.append((tokens, counted, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (step_tokens, step_logprobs, step_grads), (tokens, logprobs, grads) = gradients
    assert torch.equal(tokens, step_tokens)
    torch.testing.assert_close(logprobs, step_logprobs, atol=1e-5, rtol=1e-5)
    assert len(grads) == len(step_grads) > 0
    for grad, step_grad in zip(grads, step_grads, strict=True):
        torch.testing.assert_close(grad, step_grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("score_end", [False, True])
def test_the_training_reward_scores_caption_ends_when_asked(shapes_trainer, score_end):
    trainer = shapes_trainer(["scst.epochs=1", "scst.batch_images=4", f"scst.score_end={score_end}"])
    trainer._scst_epoch(0)  # builds the training corpus the rewards come from
    references = tokenised_references(trainer.train_records)
    image_id = trainer.train_records[0].image_id
    cut_short = references[image_id][0][:-1]
    expected = CiderD(references, end_token="<eos>" if score_end else None).score([image_id], [cut_short])
    assert trainer.train_cider.score([image_id], [cut_short]) == pytest.approx(expected)
    assert (expected < CiderD(references).score([image_id], [cut_short])) == score_end
