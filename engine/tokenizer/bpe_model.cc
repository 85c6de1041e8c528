#include "engine/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "engine/tokenizer/component_json.h"
#include "engine/tokenizer/utf8.h"

namespace trainerd::engine::tokenizer {

using nlohmann::json;

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& config) {
  const std::string where = "model BPE";
  std::unique_ptr<BpeModel> model(new BpeModel());
  if (auto it = config.find("dropout"); it != config.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0)
      return Status::Error(where + ": dropout " + it->dump() + " is not supported (set it to null)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = config.find(key);
    if (it != config.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      return Status::Error(where + ": " + key + " " + it->dump() + " is not supported");
  }
  std::string unk;
  if (auto it = config.find("unk_token"); it != config.end() && !it->is_null()) {
    TRAINERD_RETURN_IF_ERROR(ReadString(config, "unk_token", where, true, &unk));
    model->unk_token_ = unk;
  }
  TRAINERD_RETURN_IF_ERROR(ReadBool(config, "fuse_unk", where, &model->fuse_unk_));
  TRAINERD_RETURN_IF_ERROR(ReadBool(config, "byte_fallback", where, &model->byte_fallback_));
  TRAINERD_RETURN_IF_ERROR(ReadBool(config, "ignore_merges", where, &model->ignore_merges_));

  auto vocab = config.find("vocab");
  if (vocab == config.end() || !vocab->is_object())
    return Status::Error(where + ": \"vocab\" must be an object of token → id");
  model->token_storage_.reserve(vocab->size());
  model->vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX)
      return Status::Error(where + ": vocab id of \"" + it.key() + "\" must be a non-negative integer");
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    model->token_storage_.push_back(std::make_unique<std::string>(it.key()));
    const std::string* token = model->token_storage_.back().get();
    model->vocab_[*token] = id;
    if (static_cast<size_t>(id) >= model->id_to_token_.size()) model->id_to_token_.resize(id + 1, nullptr);
    model->id_to_token_[id] = token;
  }
  model->ascii_ids_.assign(128, -1);
  for (int c = 0; c < 128; ++c) {
    if (auto id = model->TokenToId(std::string(1, static_cast<char>(c)))) model->ascii_ids_[c] = *id;
  }
  model->byte_fallback_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto id = model->TokenToId(name)) model->byte_fallback_ids_[b] = *id;
  }

  auto merges = config.find("merges");
  if (merges == config.end() || !merges->is_array())
    return Status::Error(where + ": \"merges\" must be an array");
  uint32_t rank = 0;
  std::string left, right, merged;
  for (const auto& merge : *merges) {
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        return Status::Error(where + ": merge " + std::to_string(rank + 1) + " \"" + line +
                             "\" is not two tokens separated by one space");
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return Status::Error(where + ": merge " + std::to_string(rank + 1) + " must be \"a b\" or [\"a\", \"b\"]");
    }
    merged = left + right;
    auto a = model->TokenToId(left), b = model->TokenToId(right), m = model->TokenToId(merged);
    for (const auto* token : {&left, &right, &merged}) {
      if (!model->TokenToId(*token))
        return Status::Error(where + ": merge " + std::to_string(rank + 1) + " uses \"" + *token +
                             "\", which is not in the vocab");
    }
    // A repeated pair keeps its last rank, as HF's map does.
    model->merges_.Put(*a, *b, Merge{rank, *m});
    ++rank;
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  return id_to_token_[id];
}

Status BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return Status::Ok();
  if (ignore_merges_) {
    if (auto id = TokenToId(word)) {
      ids->push_back(*id);
      return Status::Ok();
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  CacheShard& shard = cache_[std::hash<std::string_view>()(word) % kCacheShards];
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    // C++17 has no heterogeneous lookup; a short word's key copy is cheap.
    auto it = shard.words.find(std::string(word));
    if (it != shard.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return Status::Ok();
    }
  }
  const size_t first = ids->size();
  TRAINERD_RETURN_IF_ERROR(MergeWord(word, ids));
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.words.size() < kCacheCapacity / kCacheShards)
      shard.words.emplace(std::string(word), std::vector<int32_t>(ids->begin() + first, ids->end()));
  }
  return Status::Ok();
}

Status BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* ids) const {
  // The word as a doubly linked list of symbols; merged-away symbols get id -1.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1});
    if (n > 0) symbols[n - 1].next = n;
  };
  int32_t pending_unk = -1;  // an unknown run not yet added (fuse_unk joins runs), or -1
  for (size_t pos = 0; pos < word.size();) {
    const size_t length = Utf8Length(static_cast<unsigned char>(word[pos]));
    const std::string_view piece = word.substr(pos, length);
    pos += length;
    std::optional<int32_t> id;
    if (length == 1) {
      if (const int32_t ascii = ascii_ids_[static_cast<unsigned char>(piece[0])]; ascii >= 0) id = ascii;
    } else {
      id = TokenToId(piece);
    }
    if (id) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : piece) all = all && byte_fallback_ids_[b] >= 0;
      if (all) {
        // As HF: a pending unknown run is not flushed before the byte tokens.
        for (unsigned char b : piece) add(byte_fallback_ids_[b]);
        continue;
      }
    }
    if (unk_token_) {
      auto unk_id = TokenToId(*unk_token_);
      if (!unk_id)
        return Status::Error("model BPE: unk_token \"" + *unk_token_ + "\" is not in the vocab");
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id;
    }
    // Without unk_token an unknown character produces no token, as in HF.
  }
  if (pending_unk >= 0) add(pending_unk);

  // Apply the lowest-ranked merge first (leftmost among equal ranks), again
  // and again; stale queue entries are recognised and skipped.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto find_merge = [this](int32_t a, int32_t b) { return merges_.Find(a, b); };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id))
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;
    left.id = top.new_id;
    const int32_t right_next = right.next;
    right.id = -1;
    left.next = right_next;
    if (right_next >= 0) symbols[right_next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = find_merge(symbols[left.prev].id, left.id)) queue.push({m->rank, left.prev, m->new_id});
    }
    if (right_next >= 0) {
      if (const Merge* m = find_merge(left.id, symbols[right_next].id)) queue.push({m->rank, top.pos, m->new_id});
    }
  }
  for (const Symbol& s : symbols)
    if (s.id >= 0) ids->push_back(s.id);
  return Status::Ok();
}

}  // namespace trainerd::engine::tokenizer
