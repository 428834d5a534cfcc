#include "intune_tf/cc/kernels/row_store.h"

#include <utility>

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
  if (budget_ != nullptr) budget_->Release(bytes_);
}

bool RowStore::HasAll(const Tensor& positions) {
  const auto pos = positions.flat<int64_t>();
  if (pos.size() == 0) return false;
  mutex_lock l(mu_);
  for (int64_t j = 0; j < pos.size(); ++j) {
    if (rows_.find(pos(j)) == rows_.end()) return false;
  }
  for (int64_t j = 0; j < pos.size(); ++j) ++rows_[pos(j)].pins;
  return true;
}

Status RowStore::Put(const Tensor& positions,
                     const std::vector<Tensor>& components, int64_t* stored) {
  const auto pos = positions.flat<int64_t>();
  int64_t count = 0;
  mutex_lock l(mu_);
  for (int64_t j = 0; j < pos.size() && !stopped_; ++j) {
    if (rows_.find(pos(j)) != rows_.end()) continue;
    Row row;
    row.components.reserve(components.size());
    for (const Tensor& component : components) {
      TensorShape shape = component.shape();
      shape.RemoveDim(0);
      Tensor element(component.dtype(), shape);
      TF_RETURN_IF_ERROR(batch_util::CopySliceToElement(component, &element, j));
      row.components.push_back(std::move(element));
    }
    row.bytes = ElementBytes(row.components);
    if (budget_ != nullptr && !budget_->Reserve(row.bytes)) {
      stopped_ = true;
      LOG(INFO) << "InTune row store " << key_ << ": no room for row "
                << pos(j) << " (" << row.bytes << " bytes) under the "
                << "process's cache budget; it keeps its " << rows_.size()
                << " rows (" << bytes_ << " bytes) and stores no more: the "
                << "others are computed every epoch.";
      break;
    }
    bytes_ += row.bytes;
    rows_.emplace(pos(j), std::move(row));
    ++count;
  }
  if (stored != nullptr) *stored = count;
  return OkStatus();
}

Status RowStore::Gather(const Tensor& positions,
                        const std::vector<PartialTensorShape>& shapes,
                        std::vector<Tensor>* out) {
  const auto pos = positions.flat<int64_t>();
  const int64_t n = pos.size();
  // The rows' tensors (shared buffers), taken under the lock; a shrink may
  // drop the rows once they are unpinned.
  std::vector<std::vector<Tensor>> rows(n);
  {
    mutex_lock l(mu_);
    int64_t missing = -1;
    for (int64_t j = 0; j < n; ++j) {
      auto it = rows_.find(pos(j));
      if (it == rows_.end()) {
        if (missing < 0) missing = j;
        continue;
      }
      rows[j] = it->second.components;
      if (it->second.pins > 0) --it->second.pins;
    }
    if (missing >= 0) {
      return errors::InvalidArgument(
          "Row store ", key_, " holds no row at position ", pos(missing),
          " (element ", missing, " of the batch): only a batch whose rows are "
          "all stored (IntuneRowStoreHas) can be gathered.");
    }
  }
  out->clear();
  const DataTypeVector dtypes = this->dtypes();
  for (size_t i = 0; i < dtypes.size(); ++i) {
    TensorShape row_shape;
    if (n > 0) {
      row_shape = rows[0][i].shape();
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
    Tensor batch(dtypes[i], batch_shape);
    for (int64_t j = 0; j < n; ++j) {
      const Tensor& row = rows[j][i];
      if (row.shape() != row_shape) {
        return errors::InvalidArgument(
            "Row store ", key_, ": the rows of component ", i, " differ in "
            "shape within a batch (", row_shape.DebugString(), " at position ",
            pos(0), ", ", row.shape().DebugString(), " at position ", pos(j),
            ")");
      }
      TF_RETURN_IF_ERROR(batch_util::CopyElementToSlice(row, &batch, j));
    }
    out->push_back(std::move(batch));
  }
  gathered_.fetch_add(1);
  return OkStatus();
}

int64_t RowStore::Shrink(int64_t bytes) {
  mutex_lock l(mu_);
  if (bytes <= 0) return 0;
  stopped_ = true;
  int64_t freed = 0;
  for (auto it = rows_.end(); it != rows_.begin() && freed < bytes;) {
    --it;
    if (it->second.pins > 0) continue;
    freed += it->second.bytes;
    it = rows_.erase(it);
  }
  bytes_ -= freed;
  if (budget_ != nullptr) budget_->Release(freed);
  return freed;
}

int64_t RowStore::rows() const {
  mutex_lock l(mu_);
  return rows_.size();
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

std::shared_ptr<RowStore> RowStoreRegistry::MakeTagged(const std::string& key) {
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
                                          CacheStore::Global(), tag);
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
