"""FedBN (Li et al., ICLR 2021): FedAvg, except that BatchNorm layers — their affine parameters and
their running statistics — stay on each client and are never sent or averaged. On a model without
BatchNorm (pFedLA's EMNIST/FashionMNIST CNN) it is exactly FedAvg, which is why pFedLA's tables
leave those columns empty.
"""
from pflbench.algorithm import ALGORITHMS, Algorithm


@ALGORITHMS.register("fedbn")
class FedBN(Algorithm):
    name = "fedbn"
    paper = "Li, Jiang, Zhang, Kamp & Dou, ICLR 2021"
    personalizes = "the BatchNorm layers (affine parameters and running statistics); the rest is FedAvg"

    def is_local(self, name: str) -> bool:
        return name in self.fed.model.batchnorm_names
