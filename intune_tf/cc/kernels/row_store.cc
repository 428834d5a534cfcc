#include "intune_tf/cc/kernels/row_store.h"

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/random.h"
#include "tensorflow/core/util/batch_util.h"

namespace tensorflow {
namespace intune {

Status CheckRowTypes(const DataTypeVector& dtypes) {
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (dtypes[i] == DT_VARIANT || dtypes[i] == DT_RESOURCE) {
      return errors::InvalidArgument(
          "A row store holds dense tensors only: component ", i, " has dtype ",
          DataTypeString(dtypes[i]),
          " (sparse, ragged, nested datasets and resources are not stored).");
    }
  }
  return OkStatus();
}

DataTypeVector RowStore::dtypes() const {
  mutex_lock l(mu_);
  return dtypes_;
}

Status RowStore::Accept(const DataTypeVector& dtypes) {
  mutex_lock l(mu_);
  if (dtypes_.empty()) {
    TF_RETURN_IF_ERROR(CheckRowTypes(dtypes));
    dtypes_ = dtypes;
  } else if (dtypes_ != dtypes) {
    return errors::InvalidArgument(
        "Row store ", key_, " holds rows of dtypes ",
        DataTypeVectorString(dtypes_), ", not ", DataTypeVectorString(dtypes));
  }
  return OkStatus();
}

RowStore::~RowStore() {
  mutex_lock l(mu_);
  Give(bytes_);
}

bool RowStore::Take(int64_t bytes) {
  if (budget_ != nullptr && !budget_->Reserve(bytes)) return false;
  if (room_ != nullptr && !room_->Take(bytes)) {
    if (budget_ != nullptr) budget_->Release(bytes);
    return false;
  }
  return true;
}

void RowStore::Give(int64_t bytes) {
  if (budget_ != nullptr) budget_->Release(bytes);
  if (room_ != nullptr) room_->Give(bytes);
}

bool RowStore::HasAll(const Tensor& positions) {
  const auto pos = positions.flat<int64_t>();
  if (pos.size() == 0) return false;
  mutex_lock l(mu_);
  for (int64_t j = 0; j < pos.size(); ++j) {
    const int64_t index = pos(j) & kRowIndexMask;
    const Chunk* chunk = ChunkOf(index, /*make=*/false);
    if (chunk == nullptr || !chunk->present[index % kRowChunk]) return false;
  }
  for (int64_t j = 0; j < pos.size(); ++j) {
    ++ChunkOf(pos(j) & kRowIndexMask, /*make=*/false)->pins;
  }
  return true;
}

int64_t RowStore::RowBytes(size_t i) const {
  if (!DataTypeCanUseMemcpy(dtypes_[i])) return -1;
  return row_shapes_[i].num_elements() * DataTypeSize(dtypes_[i]);
}

namespace {

// Where a tensor's bytes start; null for a dtype not copied by memcpy.
char* Base(const Tensor& t) {
  if (!DataTypeCanUseMemcpy(t.dtype())) return nullptr;
  return const_cast<char*>(t.tensor_data().data());
}

}  // namespace

RowStore::Chunk* RowStore::ChunkOf(int64_t index, bool make) {
  const size_t number = static_cast<size_t>(index / kRowChunk);
  if (number < chunks_.size() && chunks_[number] != nullptr) {
    return chunks_[number].get();
  }
  if (!make) return nullptr;
  auto chunk = std::make_unique<Chunk>();
  for (size_t i = 0; i < dtypes_.size(); ++i) {
    TensorShape shape = row_shapes_[i];
    shape.InsertDim(0, kRowChunk);
    chunk->columns.emplace_back(dtypes_[i], shape);
    chunk->bases.push_back(Base(chunk->columns.back()));
    chunk->bytes += chunk->columns.back().TotalBytes();
  }
  chunk->present.assign(kRowChunk, false);
  if (!Take(chunk->bytes)) return nullptr;
  bytes_ += chunk->bytes;
  if (number >= chunks_.size()) chunks_.resize(number + 1);
  chunks_[number] = std::move(chunk);
  return chunks_[number].get();
}

Status RowStore::Put(const Tensor& positions,
                     const std::vector<Tensor>& components, int64_t* stored) {
  const auto pos = positions.flat<int64_t>();
  int64_t count = 0;
  mutex_lock l(mu_);
  if (row_shapes_.empty() && !components.empty()) {
    for (const Tensor& component : components) {
      TensorShape shape = component.shape();
      shape.RemoveDim(0);
      row_shapes_.push_back(shape);
    }
  }
  std::string why_stop;
  for (size_t i = 0; i < components.size() && !stopped_; ++i) {
    TensorShape shape = components[i].shape();
    shape.RemoveDim(0);
    if (shape != row_shapes_[i]) {
      why_stop = absl::StrCat("component ", i, " has rows of shape ",
                              shape.DebugString(), ", not ",
                              row_shapes_[i].DebugString(), " as before");
    }
  }
  std::vector<int64_t> row_bytes(components.size());
  std::vector<const char*> sources(components.size());
  for (size_t i = 0; i < components.size(); ++i) {
    row_bytes[i] = RowBytes(i);
    sources[i] = Base(components[i]);
  }
  for (int64_t j = 0; j < pos.size() && !stopped_ && why_stop.empty(); ++j) {
    const int64_t index = pos(j) & kRowIndexMask;
    Chunk* chunk = ChunkOf(index, /*make=*/true);
    if (chunk == nullptr) {
      why_stop = absl::StrCat("no room for the rows at position ", index,
                              " under the process's cache budget");
      break;
    }
    const int64_t slot = index % kRowChunk;
    if (chunk->present[slot]) continue;
    int64_t string_bytes = 0;
    for (size_t i = 0; i < components.size(); ++i) {
      if (row_bytes[i] >= 0) {
        std::memcpy(chunk->bases[i] + slot * row_bytes[i],
                    sources[i] + j * row_bytes[i], row_bytes[i]);
        continue;
      }
      TF_RETURN_IF_ERROR(batch_util::CopyContiguousSlices(
          components[i], j, slot, 1, &chunk->columns[i]));
      if (dtypes_[i] != DT_STRING) continue;
      const int64_t per_row = row_shapes_[i].num_elements();
      const auto strings = chunk->columns[i].flat<tstring>();
      for (int64_t e = slot * per_row; e < (slot + 1) * per_row; ++e) {
        string_bytes += strings(e).size();
      }
    }
    if (string_bytes > 0 && !Take(string_bytes)) {
      why_stop = absl::StrCat("no room for the strings of position ", index,
                              " under the process's cache budget");
      break;
    }
    chunk->bytes += string_bytes;
    bytes_ += string_bytes;
    chunk->present[slot] = true;
    ++chunk->rows;
    ++rows_;
    ++count;
  }
  if (!why_stop.empty()) {
    stopped_ = true;
    LOG(INFO) << "InTune row store " << key_ << ": " << why_stop
              << "; it keeps its " << rows_ << " rows (" << bytes_
              << " bytes) and stores no more: the others are computed every "
              << "epoch.";
  }
  if (stored != nullptr) *stored = count;
  return OkStatus();
}

Status RowStore::Gather(const Tensor& positions,
                        const std::vector<PartialTensorShape>& shapes,
                        std::vector<Tensor>* out) {
  const auto pos = positions.flat<int64_t>();
  const int64_t n = pos.size();
  mutex_lock l(mu_);
  std::vector<Chunk*> chunks(n);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t index = pos(j) & kRowIndexMask;
    chunks[j] = ChunkOf(index, /*make=*/false);
    if (chunks[j] == nullptr || !chunks[j]->present[index % kRowChunk]) {
      return errors::InvalidArgument(
          "Row store ", key_, " holds no row at position ", pos(j),
          " (element ", j, " of the batch): only a batch whose rows are "
          "all stored (IntuneRowStoreHas) can be gathered.");
    }
  }
  out->clear();
  for (size_t i = 0; i < dtypes_.size(); ++i) {
    TensorShape row_shape;
    if (i < row_shapes_.size()) {
      row_shape = row_shapes_[i];
    } else if (!shapes[i].AsTensorShape(&row_shape)) {
      return errors::InvalidArgument(
          "Row store ", key_, ": an empty batch needs a fully known row shape "
          "for component ", i, ", got ", shapes[i].DebugString());
    }
    if (!shapes[i].IsCompatibleWith(row_shape)) {
      return errors::InvalidArgument(
          "Row store ", key_, ": component ", i, " of the stored rows has "
          "shape ", row_shape.DebugString(), ", not ",
          shapes[i].DebugString());
    }
    TensorShape batch_shape = row_shape;
    batch_shape.InsertDim(0, n);
    Tensor batch(dtypes_[i], batch_shape);
    const int64_t row_bytes = i < row_shapes_.size() ? RowBytes(i) : -1;
    char* const base = Base(batch);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = (pos(j) & kRowIndexMask) % kRowChunk;
      if (row_bytes >= 0) {
        std::memcpy(base + j * row_bytes,
                    chunks[j]->bases[i] + slot * row_bytes, row_bytes);
      } else {
        TF_RETURN_IF_ERROR(batch_util::CopyContiguousSlices(
            chunks[j]->columns[i], slot, j, 1, &batch));
      }
    }
    out->push_back(std::move(batch));
  }
  for (Chunk* chunk : chunks) {
    if (chunk->pins > 0) --chunk->pins;
  }
  gathered_.fetch_add(1);
  return OkStatus();
}

int64_t RowStore::Shrink(int64_t bytes) {
  mutex_lock l(mu_);
  if (bytes <= 0) return 0;
  stopped_ = true;
  int64_t freed = 0;
  for (size_t n = chunks_.size(); n-- > 0 && freed < bytes;) {
    if (chunks_[n] == nullptr || chunks_[n]->pins > 0) continue;
    freed += chunks_[n]->bytes;
    rows_ -= chunks_[n]->rows;
    chunks_[n].reset();
  }
  bytes_ -= freed;
  Give(freed);
  return freed;
}

int64_t RowStore::rows() const {
  mutex_lock l(mu_);
  return rows_;
}

int64_t RowStore::bytes() const {
  mutex_lock l(mu_);
  return bytes_;
}

bool RowStore::stopped() const {
  mutex_lock l(mu_);
  return stopped_;
}

RowStoreRegistry* RowStoreRegistry::Global() {
  static RowStoreRegistry* registry = new RowStoreRegistry;
  return registry;
}

Status RowStoreRegistry::GetOrCreate(const std::string& key,
                                     const DataTypeVector& dtypes,
                                     std::shared_ptr<RowStore>* store) {
  TF_RETURN_IF_ERROR(CheckRowTypes(dtypes));
  mutex_lock l(mu_);
  std::shared_ptr<RowStore>& slot = stores_[key];
  if (slot == nullptr) {
    slot = std::make_shared<RowStore>(key, dtypes, CacheStore::Global());
    CacheStore::Global()->AddHolder(slot);
  }
  TF_RETURN_IF_ERROR(slot->Accept(dtypes));
  *store = slot;
  return OkStatus();
}

std::shared_ptr<RowStore> RowStoreRegistry::MakeTagged(
    const std::string& key, std::shared_ptr<CacheRoom> room) {
  constexpr int64_t kTags = int64_t{1} << (63 - kRowTagShift);
  mutex_lock l(mu_);
  for (auto it = tagged_.begin(); it != tagged_.end();) {
    it = it->second.expired() ? tagged_.erase(it) : std::next(it);
  }
  int64_t tag = 0;
  while (tag == 0 || tagged_.count(tag) > 0) {
    tag = static_cast<int64_t>(random::New64() % static_cast<uint64_t>(kTags));
  }
  auto store = std::make_shared<RowStore>(key, DataTypeVector(),
                                          CacheStore::Global(), tag,
                                          std::move(room));
  tagged_[tag] = store;
  CacheStore::Global()->AddHolder(store);
  return store;
}

std::shared_ptr<RowStore> RowStoreRegistry::LookupTagged(
    int64_t tag, const std::string& key) const {
  mutex_lock l(mu_);
  auto it = tagged_.find(tag);
  if (it == tagged_.end()) return nullptr;
  std::shared_ptr<RowStore> store = it->second.lock();
  if (store == nullptr || store->key() != key) return nullptr;
  return store;
}

std::shared_ptr<RowStore> RowStoreRegistry::Lookup(
    const std::string& key) const {
  mutex_lock l(mu_);
  auto it = stores_.find(key);
  return it == stores_.end() ? nullptr : it->second;
}

}  // namespace intune
}  // namespace tensorflow
