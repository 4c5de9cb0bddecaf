// The DART tree pruner (docs/ARCHITECTURE.md section 5): beam search over the drafter's per-level
// top-k tokens, scored by level-weighted logit and N-gram log-probabilities, then the best
// `budget` nodes of all scored candidates form the draft tree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "context_index.hpp"
#include "ngram_store.hpp"

namespace dart {

// Every knob of the pruner, read whole from dart_core.drafters.pruning.PruningConfig by the binding.
// No defaults here: PruningConfig is the one place they are set.
struct PruneParams {
  int64_t level_top_k;  // tokens per level (the first top_k columns by logit)
  int64_t beam_width;   // candidates expanded per level
  int64_t budget;       // drafted nodes kept, root excluded
  double level_decay;   // w_lvl(l) = (l + 1) ^ -level_decay
  double logit_decay;   // w_logit(l) = logit_decay ^ l
  double ngram_weight;  // w_ng (no N-gram term at level 0)
  double eps;           // added before each log
  double context_weight;  // w_ctx: the live context's share of the N-gram probability (0 = the paper's pruner)
  int64_t context_top_k;  // continuations of the context offered per expanded candidate
};

// What proposed or supported a candidate (bits of PruneResult::source).
enum CandidateSource : uint8_t { kFromHead = 1, kFromContext = 2, kFromCorpus = 4 };

// Struct-of-arrays result. Candidates are in insertion order: level by level, within a
// level by the parent's beam rank, then by column (descending logit).
struct PruneResult {
  std::vector<int64_t> token, parent, depth, node;  // parent: candidate index, -1 = root; node: tree index or -1
  std::vector<double> logit_term, ngram_term, score;
  std::vector<uint8_t> kept;
  std::vector<uint8_t> source;  // CandidateSource bits: in the head's top-k, seen in the context, in the table
  std::vector<int64_t> tree_tokens, tree_parents, tree_depths;  // node 0 = root
  std::vector<double> tree_scores;
};

// logits/tokens: row-major [rows, k]; context: committed tokens (at least the root, which is
// the last one; only the last max(order - 1, live.max_order()) matter); store may be null (no corpus
// term); live may be null (no context candidates; so is context_weight 0): the request's committed
// tokens; eos: token ids that are never expanded. Throws std::invalid_argument on bad input.
PruneResult prune_tree(const float* logits, const int64_t* tokens, size_t rows, size_t k, const int64_t* context,
                       size_t n_context, const NgramStore* store, const int64_t* eos, size_t n_eos,
                       const PruneParams& params, const ContextIndex* live = nullptr);

}  // namespace dart
